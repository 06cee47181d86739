#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite with CTest.
#
#   bash scripts/test.sh              # what CI runs: the whole suite on
#                                     # libtorch 2.13 (build/), then the
#                                     # library and its DDP, sampler,
#                                     # checkpoint and oracle tests on Debian's
#                                     # libtorch 1.13 (build-debian/)
#   bash scripts/test.sh -R join      # extra arguments go to ctest (2.13 only)
#   DDP_TORCH=debian bash scripts/test.sh   # the whole suite on one libtorch
#
# DDP_SKIP_DEBIAN=1 leaves out the 1.13 part; DDP_TEST_JOBS sets ctest -j.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${DDP_TEST_JOBS:-2}
status=0

run_suite() {  # <DDP_TORCH> <build dir> [ctest args...]
  local torch=$1 build=$2; shift 2
  local t0=$SECONDS
  echo "test.sh: libtorch '$torch': set-up and build in $build"
  DDP_TORCH=$torch DDP_BUILD_DIR=$build bash scripts/setup.sh || return 1
  echo "test.sh: libtorch '$torch': build done after $((SECONDS - t0)) s"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
  local rc=$?
  echo "test.sh: libtorch '$torch': done after $((SECONDS - t0)) s (ctest exit $rc)"
  return $rc
}

if [ -n "${DDP_TORCH:-}" ]; then
  case $DDP_TORCH in pip) d=build ;; *) d=build-$DDP_TORCH ;; esac
  run_suite "$DDP_TORCH" "${DDP_BUILD_DIR:-$d}" "$@"
  exit $?
fi

run_suite pip "${DDP_BUILD_DIR:-build}" "$@" || status=1

if [ "${DDP_SKIP_DEBIAN:-0}" != 1 ] && [ $# -eq 0 ]; then
  # libtorch 1.13 stays supported: the library and the tests that pin its
  # numbers (DDP values, sampler indices against PyTorch 1.13, checkpoints,
  # the Python DDP 1.13 oracle). Tools and benchmarks are 2.13's business.
  suites="distributed_data_parallel_test comm_hooks_test static_graph_test sync_batchnorm_test zero_redundancy_optimizer_test flight_recorder_test distributed_sampler_test checkpoint_test ddp_oracle_test"
  DDP_CMAKE_ARGS="-DDDP_BUILD_TOOLS=OFF -DDDP_BUILD_BENCH=OFF" \
    DDP_BUILD_TARGETS="$suites checkpoint_writer" \
    run_suite debian build-debian -L "^(${suites// /|})\$" || status=1
fi
exit $status
