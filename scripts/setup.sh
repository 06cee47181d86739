#!/usr/bin/env bash
# Idempotent set-up for ddp on Debian 12: installs every package the build, the
# tests and the main job need, selects the optimized BLAS, then configures and
# builds into ./build (or $DDP_BUILD_DIR).
#
#   bash scripts/setup.sh            # install + build
#   DDP_SKIP_BUILD=1 bash scripts/setup.sh   # install only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake ninja-build pkg-config
  libtorch-dev libgloo-dev python3-torch
  libopenblas0-openmp
  libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist gnuplot-nox
  iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian's torch links the generic libblas.so.3 and libopenblas.so.0, which the
# alternatives system points at one implementation. We select OpenBLAS built
# with OpenMP: it shares libtorch's OpenMP thread pool, whereas the pthread
# build oversubscribes the cores when torch uses more than one thread
# (measurements in docs/blas.md).
select_blas() {
  local name=$1 target=$2
  if [ -e "$target" ] && [ "$(readlink -f "/etc/alternatives/$name")" != "$(readlink -f "$target")" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO update-alternatives --set "$name" "$target" >/dev/null
  fi
}
lib=/usr/lib/x86_64-linux-gnu
select_blas libblas.so.3-x86_64-linux-gnu "$lib/openblas-openmp/libblas.so.3"
select_blas liblapack.so.3-x86_64-linux-gnu "$lib/openblas-openmp/liblapack.so.3"
select_blas libopenblas.so.0-x86_64-linux-gnu "$lib/openblas-openmp/libopenblas.so.0"

if [ "${DDP_SKIP_BUILD:-0}" != "1" ]; then
  build=${DDP_BUILD_DIR:-build}
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${DDP_BUILD_TYPE:-RelWithDebInfo}
  fi
  cmake --build "$build" -j "${DDP_JOBS:-$(nproc)}"
fi
