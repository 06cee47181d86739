#!/bin/bash
# GPU benchmark: builds ddp against this machine's PyTorch 2.x (the wheel
# carries libtorch and its CMake files; no pip, no network) with NCCL, then
# runs the MLP and the transformer at W=1 on CUDA tensors, with NCCL and with
# Gloo, ddp against Python DDP and a plain libtorch loop, alternating sides
# (bench/run.py). A few minutes in all.
#
#   bench/gpu/run.sh                 # from the repository root
#   PYTHON=/path/to/python3 BUILD=/tmp/build-gpu NAME=h200 bench/gpu/run.sh
#
# Writes the summaries $RESULTS_DIR/$NAME-nccl.json and $NAME-gloo.json and
# their raw samples $RESULTS_DIR/raw/$NAME-nccl.json.gz and ...-gloo.json.gz
# (default bench/results/; BENCHMARKS.md is left alone: add the tables by
# hand with `python3 bench/report.py $RESULTS_DIR/$NAME-nccl.json`).
# scripts/gpu-check.sh calls it after its own build
# (DDP_GPU_BENCH_SKIP_BUILD=1, BACKENDS=nccl, shorter runs).
#
# Needs: CUDA PyTorch 2.x importable by $PYTHON, cmake >= 3.18, a C++17
# compiler, the headers/CMake packages of CLI11, nlohmann_json and zlib
# (Debian: libcli11-dev nlohmann-json3-dev zlib1g-dev; fmt comes with the
# wheel's headers), and Gloo's headers, which PyTorch's wheels do not ship:
# Debian's libgloo-dev, or GLOO_INCLUDE=<dir holding gloo/algorithm.h> (e.g.
# a copy of /usr/include/gloo carried to the machine; Note [Gloo headers] in
# src/compat/gloo_backend.cc says why any Gloo's declarations do).
# Status: ran once, through scripts/gpu-check.sh on an H200 (NCCL only,
# 2 repeats): BENCHMARKS.md, "On a GPU".
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
BUILD=${BUILD:-$REPO/build-gpu}
NAME=${NAME:-gpu}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-200}
BACKENDS=${BACKENDS:-nccl gloo}
RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}

echo "== PyTorch"
"$PY" - <<'EOF'
import torch
if not torch.cuda.is_available():
    raise SystemExit("bench/gpu/run.sh: torch.cuda.is_available() is False: no usable GPU")
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU", torch.cuda.get_device_name(0))
print("NCCL", torch.cuda.nccl.version(), "CXX11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI)
EOF
PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')

if [ "${DDP_GPU_BENCH_SKIP_BUILD:-0}" != 1 ]; then
  echo "== Build ($BUILD)"
  GEN="Unix Makefiles"
  command -v ninja >/dev/null 2>&1 && GEN=Ninja
  GLOO_ARGS=()
  [ -n "${GLOO_INCLUDE:-}" ] && GLOO_ARGS=(-DDDP_GLOO_INCLUDE_DIR="$GLOO_INCLUDE")
  cmake -S "$REPO" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DDDP_WITH_NCCL=ON -DDDP_BUILD_TESTS=OFF \
    -DDDP_PYTHON="$(command -v "$PY")" "${GLOO_ARGS[@]}"
  cmake --build "$BUILD" -j"$(nproc)" --target ddprun ddp-bench allreduce-bench
fi

echo "== Benchmark"
# At W=1 ddp would skip communication (the average over one rank is the
# gradient itself); Python DDP all-reduces anyway. Both sides communicate
# here, so that the comparison is like for like.
export DDP_REDUCE_AT_WORLD_SIZE_1=1
for backend in $BACKENDS; do
  "$PY" "$REPO/bench/run.py" --build-dir "$BUILD" --python "$PY" \
    --device cuda --backend "$backend" --name "$NAME-$backend" --out-dir "$RESULTS_DIR" \
    --workloads mlp,transformer --worlds 1 --oversubscribed "" \
    --repeats "$REPEATS" --steps "$STEPS" --warmup 20 --markdown ""
done
