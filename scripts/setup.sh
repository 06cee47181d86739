#!/usr/bin/env bash
# Idempotent set-up for ddp on Debian 12: installs what the build, the tests
# and the main job need, then configures and builds.
#
#   bash scripts/setup.sh                    # libtorch 2.13 from the project venv
#   DDP_TORCH=cuda bash scripts/setup.sh     # CUDA libtorch 2.14.1 (C++20), NCCL
#   DDP_TORCH=debian bash scripts/setup.sh   # Debian's libtorch-dev 1.13
#   DDP_TORCH=custom Torch_DIR=/opt/libtorch/share/cmake/Torch bash scripts/setup.sh
#   DDP_SKIP_BUILD=1 bash scripts/setup.sh   # install only
#
# Which libtorch (README, "Which libtorch"):
#   pip     (default) .venv/ with PyPI's torch==2.13.0 CPU build; its libtorch
#           (headers, libraries, CMake package) is LibTorch 2.13, and its
#           Python DDP is the tests' oracle. Build dir: build/.
#   cuda    PyTorch 2.14.1 built for CUDA 13, in a venv outside the clone
#           ($DDP_CUDA_VENV, default ~/.cache/ddp/venv-torch-2.14.1-cu13; about
#           5.5 GB with its nvidia-* wheels, NCCL included; reused when
#           present). Its libtorch is CUDA LibTorch 2.14.1 and needs C++20;
#           cmake/ddp_cuda.cmake finds the CUDA toolkit (nvcc) and takes the
#           headers and libnvrtc the toolkit lacks from the wheel. NCCL is on.
#           Runs CPU tensors without a GPU, so the CPU suite runs on it.
#           Build dir: build-cuda/.
#   debian  libtorch-dev 1.13.1 and python3-torch from Debian, OpenBLAS
#           (OpenMP build) selected. Build dir: build-debian/.
#   custom  a LibTorch you provide: Torch_DIR or CMAKE_PREFIX_PATH in the
#           environment, as PyTorch documents. Build dir: build-custom/.
# DDP_BUILD_DIR overrides the build directory; DDP_CMAKE_ARGS adds options
# (e.g. "-DDDP_BUILD_BENCH=OFF"); DDP_BUILD_TARGETS builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."

torch_choice=${DDP_TORCH:-pip}
torch_version=2.13.0
cuda_torch_version=2.14.1
case $torch_choice in
  pip) default_build=build ;;
  cuda) default_build=build-cuda ;;
  debian) default_build=build-debian ;;
  custom) default_build=build-custom ;;
  *) echo "setup: DDP_TORCH=$torch_choice: expected pip, cuda, debian or custom" >&2; exit 2 ;;
esac

packages=(
  g++ cmake ninja-build pkg-config
  libgloo-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist gnuplot-nox
  iproute2 procps
)
if [ "$torch_choice" = debian ]; then
  packages+=(libtorch-dev python3-torch libopenblas0-openmp)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A venv holding torch==<version> (and numpy), made with the python3 first
# on PATH when missing or holding another version.
ensure_venv() {  # <venv> <torch version> <what>
  local venv=$1 version=$2
  if ! "$venv/bin/python" -c "import torch, numpy, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
    echo "setup: installing torch==$version ($3) into $venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==$version" numpy
  fi
}

cmake_args=()
if [ "$torch_choice" = pip ]; then
  # pip takes the CPU wheel of torch 2.13.0 (about 1 GB installed) without
  # asking PyPI for a CUDA build. numpy: torch's tensor <-> array bridge,
  # used by the oracle.
  venv=.venv
  ensure_venv "$venv" "$torch_version" "CPU"
  prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix" "-DDDP_PYTHON=$PWD/$venv/bin/python3")
elif [ "$torch_choice" = cuda ]; then
  # The CUDA 13 wheel and its nvidia-* wheels (NCCL among them); kept out of
  # the clone so that fresh clones reuse it. The toolkit's nvcc is needed
  # by the CMake package (enable_language(CUDA)): it must be installed.
  venv=${DDP_CUDA_VENV:-$HOME/.cache/ddp/venv-torch-$cuda_torch_version-cu13}
  if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDA_HOME:-}" ]; then
    echo "setup: DDP_TORCH=cuda needs the CUDA toolkit (nvcc) for libtorch's CMake package; none found (PATH, /usr/local/cuda, CUDA_HOME)" >&2
    exit 2
  fi
  mkdir -p "$(dirname "$venv")"
  ensure_venv "$venv" "$cuda_torch_version" "CUDA 13"
  prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix" "-DDDP_PYTHON=$venv/bin/python3")
elif [ "$torch_choice" = debian ]; then
  # Debian's torch links the generic libblas.so.3 and libopenblas.so.0, which
  # the alternatives system points at one implementation. We select OpenBLAS
  # built with OpenMP: it shares libtorch's OpenMP thread pool, whereas the
  # pthread build oversubscribes the cores when torch uses more than one
  # thread; the reference BLAS is 13x slower.
  select_blas() {
    local name=$1 target=$2
    if [ -e "$target" ] && [ "$(readlink -f "/etc/alternatives/$name")" != "$(readlink -f "$target")" ]; then
      $SUDO update-alternatives --set "$name" "$target" >/dev/null
    fi
  }
  lib=/usr/lib/x86_64-linux-gnu
  select_blas libblas.so.3-x86_64-linux-gnu "$lib/openblas-openmp/libblas.so.3"
  select_blas liblapack.so.3-x86_64-linux-gnu "$lib/openblas-openmp/liblapack.so.3"
  select_blas libopenblas.so.0-x86_64-linux-gnu "$lib/openblas-openmp/libopenblas.so.0"
  cmake_args+=("-DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch" "-DDDP_PYTHON=/usr/bin/python3")
else
  if [ -z "${Torch_DIR:-}" ] && [ -z "${CMAKE_PREFIX_PATH:-}" ]; then
    echo "setup: DDP_TORCH=custom needs Torch_DIR (…/share/cmake/Torch of your LibTorch) or CMAKE_PREFIX_PATH" >&2
    exit 2
  fi
  [ -n "${Torch_DIR:-}" ] && cmake_args+=("-DTorch_DIR=$Torch_DIR")
fi

if [ "${DDP_SKIP_BUILD:-0}" != "1" ]; then
  build=${DDP_BUILD_DIR:-$default_build}
  # shellcheck disable=SC2206  # DDP_CMAKE_ARGS is a list of options
  extra=(${DDP_CMAKE_ARGS:-})
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DDP_BUILD_TYPE:-RelWithDebInfo}" \
      "${cmake_args[@]}" "${extra[@]}"
  fi
  # shellcheck disable=SC2206
  targets=(${DDP_BUILD_TARGETS:-})
  if ((${#targets[@]})); then
    cmake --build "$build" -j "${DDP_JOBS:-$(nproc)}" --target "${targets[@]}"
  else
    cmake --build "$build" -j "${DDP_JOBS:-$(nproc)}"
  fi
fi
