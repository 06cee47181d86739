#!/usr/bin/env bash
# Installs the build into a temporary prefix, then configures, builds and
# runs tests/package/consumer (find_package(ddp), ddp::ddp) against it.
#
#   package_test.sh <cmake> <build dir> <consumer source dir> <work dir>
set -euo pipefail
cmake=$1 build=$2 consumer=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

step() { echo "package_test: $*"; }
fail() { echo "package_test: FAILED: $*" >&2; exit 1; }

step "installing $build into $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install (is the whole project built?)"; }
config=$(find "$prefix" -name ddpConfig.cmake | head -1)
[ -n "$config" ] || fail "no ddpConfig.cmake under $prefix"
[ -f "$prefix/include/ddp/process_group.h" ] || fail "headers not installed"

step "configuring the consumer with CMAKE_PREFIX_PATH=$prefix"
# Only the installed package may be found: not the build tree's export.
"$cmake" -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; fail "configure"; }
grep -q "ddp_DIR:PATH=$prefix" "$work/build/CMakeCache.txt" ||
  fail "ddp was not found in $prefix: $(grep ddp_DIR "$work/build/CMakeCache.txt")"

step "building the consumer"
"$cmake" --build "$work/build" -j2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "build"; }

step "running it"
out=$(env -u RANK -u WORLD_SIZE -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK \
  "$work/build/app" 2>&1) || { echo "$out" >&2; fail "the consumer exited with an error"; }
echo "$out"
[[ $out == *"consumer: ok source single-process rank 0 world_size 1"* ]] ||
  fail "unexpected output"
# The program must use the installed library, not the build tree's.
lib=$(ldd "$work/build/app" | awk '/libddp/ {print $3}')
[[ -z $lib || $lib == "$prefix"/* ]] || fail "app loads $lib, not the installed libddp"
# The installed tools start from the prefix (install RPATH), with no help
# from the build tree or LD_LIBRARY_PATH.
for tool in ddp-demo ddp-train ddprun; do
  [ -x "$prefix/bin/$tool" ] || fail "$tool is not installed"
  help=$(env -u LD_LIBRARY_PATH "$prefix/bin/$tool" --help 2>&1) ||
    { echo "$help" >&2; fail "installed $tool --help failed"; }
done
lib=$(ldd "$prefix/bin/ddp-train" | awk '/libddp/ {print $3}')
[[ $lib == "$prefix"/* ]] || fail "installed ddp-train loads libddp from '$lib', not $prefix"
if ldd "$prefix/bin/ddp-train" | grep -q "not found"; then
  ldd "$prefix/bin/ddp-train" >&2
  fail "installed ddp-train has unresolved libraries"
fi
rm -rf "$work"
step "passed"
