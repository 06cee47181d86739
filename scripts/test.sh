#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite with CTest.
#
#   bash scripts/test.sh              # what CI runs, three libtorch builds:
#                                     #  1. CUDA libtorch 2.14.1 (build-cuda/,
#                                     #     C++20, NCCL): the whole suite (the
#                                     #     GPU tests skip without a GPU,
#                                     #     each saying why);
#                                     #  2. libtorch 2.13, CPU (the main
#                                     #     job's; build-subset/, so that
#                                     #     build/ stays whole for
#                                     #     main.sh): the library and its
#                                     #     collectives, DDP (join, errors,
#                                     #     divergence), checkpoint and
#                                     #     oracle suites;
#                                     #  3. Debian's libtorch 1.13
#                                     #     (build-debian/): the same but the
#                                     #     collectives suite.
#   bash scripts/test.sh -R join      # extra arguments go to ctest, on the
#                                     # whole-suite build only
#   DDP_TORCH=pip bash scripts/test.sh      # the whole suite on one libtorch
#
# Without the CUDA toolkit (no nvcc) the whole suite runs on 2.13 instead,
# saying so; in CI (CI set) a missing toolkit is an error. DDP_SKIP_DEBIAN=1
# leaves out the 1.13 part, DDP_SKIP_SUBSETS=1 both subsets; DDP_TEST_JOBS
# sets ctest -j. docs/compat.md has the timings.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${DDP_TEST_JOBS:-2}
status=0
summary=()  # a line per build, printed last: CI shows a run's tail only

# Adds <build>'s result to the summary, naming the tests that failed.
note_result() {  # <DDP_TORCH> <build dir> <what> <seconds>
  local line="libtorch '$1' ($2): $3 after $4 s"
  local failed="$2/Testing/Temporary/LastTestsFailed.log"
  if [ "$3" != "passed" ] && [ -s "$failed" ]; then
    line+="; failed: $(cut -d: -f2- "$failed" | head -20 | paste -sd' ')"
  fi
  summary+=("$line")
}

run_suite() {  # <DDP_TORCH> <build dir> [ctest args...]
  local torch=$1 build=$2; shift 2
  local t0=$SECONDS
  echo "test.sh: libtorch '$torch': set-up and build in $build"
  if ! DDP_TORCH=$torch DDP_BUILD_DIR=$build bash scripts/setup.sh; then
    note_result "$torch" "$build" "set-up or build FAILED" $((SECONDS - t0))
    return 1
  fi
  echo "test.sh: libtorch '$torch': build done after $((SECONDS - t0)) s"
  rm -f "$build/Testing/Temporary/LastTestsFailed.log"
  # --no-tests=error: a -R or -L that matches nothing fails, never passes.
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" "$@"
  local rc=$?
  echo "test.sh: libtorch '$torch': done after $((SECONDS - t0)) s (ctest exit $rc)"
  if [ $rc -eq 0 ]; then
    note_result "$torch" "$build" "passed" $((SECONDS - t0))
  else
    note_result "$torch" "$build" "tests FAILED (ctest exit $rc)" $((SECONDS - t0))
  fi
  return $rc
}

# A subset: the library and these suites only (no tools, benchmarks or
# examples), run by their labels (each binary's, the @gloo copies too).
run_subset() {  # <DDP_TORCH> <build dir> <suites...>
  local torch=$1 build=$2; shift 2
  local suites="$*"
  DDP_CMAKE_ARGS="-DDDP_BUILD_TOOLS=OFF -DDDP_BUILD_BENCH=OFF -DDDP_BUILD_EXAMPLES=OFF" \
    DDP_BUILD_TARGETS="$suites checkpoint_writer" \
    run_suite "$torch" "$build" -L "^(${suites// /|})\$"
}

if [ -n "${DDP_TORCH:-}" ]; then
  case $DDP_TORCH in pip) d=build ;; *) d=build-$DDP_TORCH ;; esac
  run_suite "$DDP_TORCH" "${DDP_BUILD_DIR:-$d}" "$@"
  status=$?
  printf 'test.sh: %s\n' "${summary[@]}"
  exit $status
fi

have_nvcc() {
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
    { [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; }
}

whole=cuda
if ! have_nvcc; then
  if [ -n "${CI:-}" ]; then
    echo "test.sh: CI needs the CUDA toolkit (nvcc) for the CUDA libtorch build; none found" >&2
    exit 1
  fi
  echo "test.sh: no CUDA toolkit (nvcc): the whole suite runs on libtorch 2.13 instead of the CUDA build"
  whole=pip
fi
case $whole in cuda) whole_dir=build-cuda ;; *) whole_dir=build ;; esac
run_suite "$whole" "${DDP_BUILD_DIR:-$whole_dir}" "$@" || status=1

if [ "${DDP_SKIP_SUBSETS:-0}" != 1 ] && [ $# -eq 0 ]; then
  # What the other builds run: docs/compat.md has why (CI's 60 minutes)
  # and the timings. The oracle suite compares with that libtorch's own
  # Python DDP (hooks, static graph and join included).
  core="distributed_data_parallel_test checkpoint_test state_dict_test ddp_oracle_test"
  # libtorch 2.13, the main job's: the library (C++17) and the suites that
  # pin its numbers, against Python DDP 2.13.
  if [ "$whole" = cuda ]; then
    run_subset pip build-subset $core collectives_test collectives_sharding_test \
      fully_shard_test fully_shard_oracle_test || status=1
  fi
  # libtorch 1.13 stays supported: the same suites against Python DDP 1.13.
  if [ "${DDP_SKIP_DEBIAN:-0}" != 1 ]; then
    run_subset debian build-debian $core collectives_sharding_test fully_shard_test || status=1
  fi
fi
if [ $# -gt 0 ] || [ "${DDP_SKIP_SUBSETS:-0}" = 1 ]; then
  summary+=("the 2.13 and 1.13 subsets: not run (ctest arguments given, or DDP_SKIP_SUBSETS=1)")
elif [ "${DDP_SKIP_DEBIAN:-0}" = 1 ]; then
  summary+=("libtorch 'debian': not run (DDP_SKIP_DEBIAN=1)")
fi
echo "test.sh: summary ($((SECONDS / 60)) min in all):"
printf 'test.sh:   %s\n' "${summary[@]}"
exit $status
