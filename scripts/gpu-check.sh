#!/usr/bin/env bash
# The prepared GPU check: one command for a lent GPU machine (x86-64, one or
# more CUDA GPUs, Python 3 with a CUDA build of PyTorch 2.x as `python3`,
# CMake, ninja, nvcc; no network and none of Debian's -dev packages).
#
#   bash scripts/gpu-check.sh --bundle   # HERE (Debian, packages installed by
#                                        # scripts/setup.sh): copies what the
#                                        # build needs and such a machine lacks
#                                        # into build-gpu-deps/ (about 6 MiB)
#   bash scripts/gpu-check.sh            # THERE, with build-gpu-deps/ carried
#                                        # along (the device tool's carry)
#
# The check builds ddp against that PyTorch (build-gpu/: libddp, gpu_test,
# ddprun and the benchmarks, NCCL on), runs the CTest label `gpu`
# (tests/gpu_test.cc), then bench/gpu/run.sh (ddp against Python DDP on NCCL
# at world size 1, the MLP and the transformer, alternating), and writes
# everything into build-gpu/gpu-check/: machine.txt, configure.log,
# build.log, tests.log, tests.xml (JUnit), gpu-check-nccl.json (the
# benchmark's summary; its raw samples in raw/gpu-check-nccl.json.gz),
# bench.log and summary.txt. When $OUT is set (the device tool brings back
# at most 8 files of it), the script ends by copying summary.txt, tests.log,
# bench.log and gpu-check-nccl.json there, and all of build-gpu/gpu-check/
# as gpu-check.tar.gz. Each phase has its own time limit, all inside
# a budget of 520 s (BUDGET) so that the whole stays well inside 9 minutes, under the
# device tool's 600 s per command; a phase that runs out is named in
# summary.txt (exit status 3, never 124: that would read as the command's
# own timeout) and the next phases still run where they can.
#
# DDP_GPU_CHECK_BUILD_ONLY=1 stops after the build (what a machine without
# a GPU can check; on 2 cores the build needs DDP_GPU_CHECK_BUILD_LIMIT=1500
# seconds, not 270); PYTHON=<python3>, BUILD=<dir> override the defaults;
# DDP_GPU_CHECK_CMAKE_ARGS adds configure options (checked here with
# -DCMAKE_IGNORE_PREFIX_PATH=/usr, so that CMake finds nothing of Debian's
# and everything in build-gpu-deps/).
#
# Checked here (no GPU): the build half against PyTorch 2.14.1 for CUDA 13,
# and (2026-12-06, 387 s on 2 cores) against PyTorch 2.11.0, the GPU
# machine's version. Ran once on an H200 with PyTorch 2.11 (2026-12-04):
# what it found is in docs/compat.md ("On a GPU": a crash, since explained
# and fixed there), its benchmark in BENCHMARKS.md.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEPS=$REPO/build-gpu-deps

bundle() {
  # What the build takes from Debian's packages, as files: header-only
  # libraries with their CMake packages, Gloo's headers (declarations only:
  # Note [Gloo headers] in src/compat/gloo_backend.cc), zlib's headers and
  # library, GoogleTest's sources (built there with the machine's compiler).
  local zconf=/usr/include/zconf.h  # Debian 12's; multiarch copies elsewhere
  [ -e "$zconf" ] || zconf=/usr/include/x86_64-linux-gnu/zconf.h
  local need=(/usr/include/CLI /usr/share/cmake/CLI11 /usr/include/nlohmann
              /usr/share/cmake/nlohmann_json /usr/include/gloo /usr/include/zlib.h
              "$zconf" /usr/src/googletest)
  for f in "${need[@]}"; do
    if [ ! -e "$f" ]; then
      echo "gpu-check --bundle: $f is missing; run DDP_SKIP_BUILD=1 bash scripts/setup.sh first" >&2
      exit 2
    fi
  done
  rm -rf "$DEPS"
  mkdir -p "$DEPS/include" "$DEPS/share/cmake" "$DEPS/lib"
  cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/gloo /usr/include/zlib.h \
    "$zconf" "$DEPS/include/"
  cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$DEPS/share/cmake/"
  cp -L /lib/x86_64-linux-gnu/libz.so.1 "$DEPS/lib/libz.so.1"
  cp -r /usr/src/googletest "$DEPS/googletest"
  echo "gpu-check --bundle: $(du -sh "$DEPS" | cut -f1) in $DEPS (carry it: build-gpu-deps)"
}

if [ "${1:-}" = "--bundle" ]; then
  bundle
  exit 0
fi

PY=${PYTHON:-python3}
BUDGET=${BUDGET:-520}
BUILD=${BUILD:-$REPO/build-gpu}
RESULTS=$BUILD/gpu-check
rm -rf "$RESULTS"
mkdir -p "$BUILD" "$RESULTS"
SUMMARY=$RESULTS/summary.txt
: >"$SUMMARY"
T0=$SECONDS
# What comes back from a device machine: few files (the tool's limit is 8).
bring_back() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  for f in summary.txt tests.log bench.log gpu-check-nccl.json; do
    [ -e "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT/"
  done
  tar czf "$OUT/gpu-check.tar.gz" -C "$BUILD" gpu-check 2>/dev/null
}
trap bring_back EXIT
say() { echo "gpu-check: $*" | tee -a "$SUMMARY"; }
# phase <name> <seconds> <log> <command...>: runs it bounded, logs it, notes the outcome.
phase() {
  local name=$1 limit=$2 log=$3; shift 3
  local t=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "$name: ran out of its $limit s (log: $(basename "$log"))"
  else
    say "$name: exit $rc after $((SECONDS - t)) s (log: $(basename "$log"))"
  fi
  return $rc
}

if [ ! -d "$DEPS" ]; then
  say "build-gpu-deps/ is missing: run 'bash scripts/gpu-check.sh --bundle' on the development machine and carry it"
  exit 2
fi

"$PY" - >"$RESULTS/machine.txt" 2>&1 <<'EOF'
import os, platform, torch
print("host", platform.node(), platform.machine(), "cpus", os.cpu_count())
print("python", platform.python_version(), "torch", torch.__version__, "CUDA", torch.version.cuda)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print("device", i, torch.cuda.get_device_name(i))
if torch.cuda.is_available():
    print("nccl", torch.cuda.nccl.version())
print("cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)
EOF
cat "$RESULTS/machine.txt" | tee -a "$SUMMARY"
PREFIX=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') || {
  say "python3 cannot import torch"; exit 2; }
GEN="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GEN=Ninja
command -v nvcc >/dev/null 2>&1 || say "nvcc is not on PATH: configuring a CUDA libtorch needs the toolkit"

phase configure 100 "$RESULTS/configure.log" \
  cmake -S "$REPO" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$DEPS;$PREFIX" -DDDP_PYTHON="$(command -v "$PY")" \
    -DDDP_GLOO_INCLUDE_DIR="$DEPS/include" -DZLIB_INCLUDE_DIR="$DEPS/include" \
    -DZLIB_LIBRARY="$DEPS/lib/libz.so.1" -DDDP_GTEST_SOURCE_DIR="$DEPS/googletest" \
    -DDDP_WITH_NCCL=ON -DDDP_BUILD_EXAMPLES=OFF ${DDP_GPU_CHECK_CMAKE_ARGS:-} \
  || { tail -30 "$RESULTS/configure.log"; say "stopped: configure failed"; exit 1; }
grep -E "libtorch|CUDA libtorch|C\+\+[0-9]" "$RESULTS/configure.log" | tee -a "$SUMMARY"

# -k: on a failure, every translation unit's errors in one run, not the first's.
keep_going=(-k)
[ "$GEN" = Ninja ] && keep_going=(-k 0)
phase build "${DDP_GPU_CHECK_BUILD_LIMIT:-270}" "$RESULTS/build.log" \
  cmake --build "$BUILD" -j "$(nproc)" --target gpu_test ddprun ddp-bench allreduce-bench \
    -- "${keep_going[@]}" \
  || { grep -E -A3 "error|FAILED" "$RESULTS/build.log" | head -80; say "stopped: build failed"; exit 1; }
# Which CUDA libraries the tests load, and from where (the toolkit's or the
# wheel's): in the tarball, for reading a crash.
ldd "$BUILD/tests/gpu_test" >"$RESULTS/ldd.txt" 2>&1
# Note [remove_all and libtorch 2.11]: what crashed the last run on a GPU.
# No binary built here calls std::filesystem::remove_all, and where this
# libtorch exports it, the tests load libstdc++ before libtorch.
bash "$REPO/tests/compat/no_remove_all.sh" "$BUILD" 2>&1 | tee -a "$SUMMARY"
needed=$(readelf -d "$BUILD/tests/gpu_test" 2>/dev/null | grep -oE 'lib(stdc\+\+|torch)\.so[^]]*' | tr '\n' ' ')
say "gpu_test's first libraries: ${needed:-unknown (no readelf)}"
if [ "${DDP_GPU_CHECK_BUILD_ONLY:-0}" = 1 ]; then
  say "built in $((SECONDS - T0)) s; DDP_GPU_CHECK_BUILD_ONLY=1: no tests, no benchmark"
  exit 0
fi

# The tests: CTest label gpu. A skipped test (too few GPUs) says why.
junit=()
ctest --help 2>/dev/null | grep -q -- --output-junit && junit=(--output-junit "$RESULTS/tests.xml")
left=$((BUDGET - (SECONDS - T0)))
[ "$left" -gt 150 ] && left=150
phase tests "$left" "$RESULTS/tests.log" \
  ctest --test-dir "$BUILD" -L '^gpu$' --output-on-failure --timeout 90 "${junit[@]}"
tests_rc=$?
if [ $tests_rc -eq 124 ] || [ $tests_rc -eq 137 ]; then tests_rc=3; fi
grep -E "tests passed|Skipped|\*\*\*Failed|\*\*\*Timeout|Not Run" "$RESULTS/tests.log" | tee -a "$SUMMARY"

# A test that crashed is run again under a debugger, up to three of them,
# for where it crashed: the backtrace, and the words on the stack as
# symbols (a call through a null pointer leaves no frame to unwind, but its
# return address is the top word).
gdb=$(command -v gdb || command -v cuda-gdb || true)
crashed=$(grep -oE "Test +#[0-9]+: [^ ]+ \.+\*\*\*Exception" "$RESULTS/tests.log" | awk '{print $3}' | head -3)
if [ -n "$crashed" ] && [ -n "$gdb" ]; then
  for t in $crashed; do
    left=$((BUDGET - (SECONDS - T0)))
    [ "$left" -gt 100 ] || break
    phase "crash $t" 60 "$RESULTS/crash-$t.log" "$gdb" -batch -ex run -ex "bt 12" -ex 'x/16a $sp' \
      --args "$BUILD/tests/gpu_test" "--gtest_filter=$t"
    grep -E "^#[0-9]|<[^>]+>" "$RESULTS/crash-$t.log" | grep -v "^0x0*0 " | head -20 >>"$SUMMARY"
  done
fi

# The benchmark, with what time is left (at most 240 s): NCCL at W=1,
# communication forced through NCCL so that ddp does what Python DDP does.
# bench.log has each run's figure as it comes, should the phase run out.
left=$((BUDGET - (SECONDS - T0)))
if [ "$left" -gt 60 ]; then
  [ "$left" -gt 240 ] && left=240
  DDP_GPU_BENCH_SKIP_BUILD=1 PYTHON="$PY" BUILD="$BUILD" NAME=gpu-check REPEATS=2 STEPS=100 \
    RESULTS_DIR="$RESULTS" BACKENDS=nccl \
    phase benchmark "$left" "$RESULTS/bench.log" bash "$REPO/bench/gpu/run.sh"
  tail -25 "$RESULTS/bench.log" >>"$SUMMARY"
else
  say "benchmark: skipped, only $left s left of the $BUDGET s budget"
fi
say "done in $((SECONDS - T0)) s"
exit $tests_rc
