#!/usr/bin/env bash
# Runs the test suite under the sanitizers, each in its own build directory:
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (GCC), the whole suite
#         (ctest), in build-asan;
#   tsan: ThreadSanitizer (GCC), the tests of the threads ddp runs: the
#         reducer and DDP (distributed_data_parallel_test, reducer_test),
#         the collectives, the shared-memory path (shm_test), the flight
#         recorder (flight_recorder_test: signal handlers, mapped rings) and
#         the comm hooks (comm_hooks_test, powersgd_test), in build-tsan.
# Against libtorch 2.13 (the project venv, as scripts/setup.sh) by default;
# DDP_TORCH=debian uses Debian's 1.13 instead (build-asan-debian,
# build-tsan-debian).
# Only ddp's code is instrumented: libtorch, Gloo and the other Debian
# libraries are not. Suppressions for noise from those libraries are in
# scripts/sanitizers/*.supp, each entry with the reason it is not ours.
# Findings, run times and the reasoning are in docs/hardening.md.
#
#   bash scripts/sanitize.sh              # asan then tsan
#   bash scripts/sanitize.sh tsan         # one of them
#   bash scripts/sanitize.sh asan -R Checkpoint   # extra arguments go to ctest
#
# Environment: DDP_JOBS (build jobs, default 2), DDP_TEST_JOBS (ctest jobs,
# default 1: sanitized tests are slow, and several start processes),
# DDP_SANITIZE_BUILD_TYPE (default RelWithDebInfo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
supp=$root/scripts/sanitizers
jobs=${DDP_JOBS:-2}
test_jobs=${DDP_TEST_JOBS:-1}
build_type=${DDP_SANITIZE_BUILD_TYPE:-RelWithDebInfo}

kinds=()
while (($#)) && [[ $1 == asan || $1 == tsan ]]; do kinds+=("$1"); shift; done
((${#kinds[@]})) || kinds=(asan tsan)
ctest_args=("$@")

torch=${DDP_TORCH:-pip}
DDP_TORCH=$torch DDP_SKIP_BUILD=1 bash scripts/setup.sh  # packages and the venv only
suffix=""
case $torch in
  pip)
    prefix=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
    torch_args=("-DCMAKE_PREFIX_PATH=$prefix" "-DDDP_PYTHON=$root/.venv/bin/python3") ;;
  debian)
    suffix=-debian
    torch_args=("-DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch" "-DDDP_PYTHON=/usr/bin/python3") ;;
  *) echo "sanitize: DDP_TORCH=$torch: expected pip or debian" >&2; exit 2 ;;
esac

# configure <dir> <sanitizer flags> <cmake args...>: once; the flags are in
# the cache afterwards. The precompiled header stays on: every target of the
# directory shares the sanitizer flags, so GCC accepts it.
configure() {
  local dir=$1 flags=$2
  shift 2
  [[ -f $dir/build.ninja ]] && return 0
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
    -DDDP_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    "${torch_args[@]}" "$@"
}

status=0
run_ctest() {
  local dir=$1
  shift
  local start=$SECONDS
  # Tests of targets not built in this directory are registered as
  # <target>_NOT_BUILT by gtest_discover_tests: skip them. gloo_backend_abi
  # proves a property of the normal build's object code (Note [Gloo
  # headers]); UBSan's vptr checks add typeinfo references of their own.
  if ctest --test-dir "$dir" --output-on-failure -j "$test_jobs" \
      -E '_NOT_BUILT$|^package_consumer$|^gloo_backend_abi$' \
      "$@" "${ctest_args[@]}"; then
    echo "sanitize: $(basename "$dir"): passed in $((SECONDS - start)) s"
  else
    echo "sanitize: $(basename "$dir"): FAILED (see the output above) after $((SECONDS - start)) s"
    status=1
  fi
}

for kind in "${kinds[@]}"; do
  case $kind in
    asan)
      dir=build-asan$suffix
      configure "$dir" "-fsanitize=address,undefined"
      cmake --build "$dir" -j "$jobs"
      # Leaks are checked (DDP_ASAN_DETECT_LEAKS=0 turns it off); lsan.supp
      # names the libraries whose process-lifetime allocations are not ours.
      # halt_on_error: any UB report fails its test instead of scrolling by.
      # handle_segv/sigbus/sigfpe=0: the fatal-signal tests raise them on
      # purpose and check that the flight recorder notes the signal and the
      # process still dies by it, which ASan's own handler would replace
      # (a wild access still crashes its test).
      ASAN_OPTIONS="detect_leaks=${DDP_ASAN_DETECT_LEAKS:-1}:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:abort_on_error=0:handle_segv=0:handle_sigbus=0:handle_sigfpe=0" \
      LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
      UBSAN_OPTIONS="suppressions=$supp/ubsan.supp:print_stacktrace=1:halt_on_error=1" \
        run_ctest "$dir"
      ;;
    tsan)
      dir=build-tsan$suffix
      # Tools off: only these test binaries (and libddp) are built.
      configure "$dir" "-fsanitize=thread" -DDDP_BUILD_TOOLS=OFF
      cmake --build "$dir" -j "$jobs" --target distributed_data_parallel_test reducer_test \
        collectives_test shm_test flight_recorder_test comm_hooks_test powersgd_test
      TSAN_OPTIONS="suppressions=$supp/tsan.supp:print_suppressions=0:second_deadlock_stack=1:halt_on_error=0" \
        run_ctest "$dir"
      ;;
  esac
done
exit $status
