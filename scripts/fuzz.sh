#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with Debian's clang and runs them one
# after the other, each for a fixed time, with ASan+UBSan.
#
#   bash scripts/fuzz.sh                    # idx, checkpoint, torch_load, flight_trace,
#                                           # grad_scaler_state: 600 s each
#   bash scripts/fuzz.sh --time 60 idx      # one target, one minute
#   bash scripts/fuzz.sh --seeds            # rewrite fuzz/corpus/* and stop
#   bash scripts/fuzz.sh --coverage         # line coverage of the parsers
#                                           # reached by the corpus so far
#
# Seeds (small valid files, in git) are in fuzz/corpus/<target>; what the
# fuzzer adds goes to out/fuzz/<target>/corpus (not in git), which later runs
# start from too. A crash, a hang (one input longer than --timeout seconds),
# an uncaught exception, an ASan/UBSan report or the fuzzer's own contract
# check (see fuzz/*_fuzzer.cc) stops the run and leaves the input as
# out/fuzz/<target>/crash-* (or timeout-*, oom-*); reproduce with
#   build-fuzz/fuzz/<target>_fuzzer out/fuzz/<target>/crash-...
# Exit status: 0 when every target ran its time without a finding.
#
# Environment: DDP_FUZZ_BUILD_DIR (build-fuzz), DDP_FUZZ_OUT (out/fuzz),
# DDP_JOBS (build jobs, 2), DDP_FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=600
timeout=10
seeds_only=0
coverage=0
targets=()
while (($#)); do
  case $1 in
    --time) seconds=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --seeds) seeds_only=1; shift ;;
    --coverage) coverage=1; shift ;;
    idx | checkpoint | torch_load | flight_trace | grad_scaler_state) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (expected --time S, --timeout S, --seeds, idx, checkpoint, torch_load, flight_trace, grad_scaler_state)" >&2; exit 2 ;;
  esac
done
((${#targets[@]})) || targets=(idx checkpoint torch_load flight_trace grad_scaler_state)
build=${DDP_FUZZ_BUILD_DIR:-build-fuzz}
out=${DDP_FUZZ_OUT:-out/fuzz}

# The normal set-up's packages, plus clang and its runtime (libFuzzer and the
# sanitizers), which only fuzzing needs.
DDP_SKIP_BUILD=1 bash scripts/setup.sh
missing=()
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ ! -f $build/build.ninja ]]; then
  # No precompiled header: it is GCC's in the other build directories, and
  # only three sources are compiled here.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DDDP_BUILD_FUZZERS=ON -DDDP_USE_PCH=OFF \
    -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_TOOLS=OFF -DDDP_BUILD_BENCH=OFF
fi
cmake --build "$build" -j "${DDP_JOBS:-2}" --target idx_fuzzer checkpoint_fuzzer torch_load_fuzzer \
  flight_trace_fuzzer grad_scaler_state_fuzzer fuzz_seeds

if ((seeds_only)); then
  rm -f fuzz/corpus/idx/* fuzz/corpus/checkpoint/* fuzz/corpus/flight_trace/*
  "$build/fuzz/fuzz_seeds" fuzz/corpus
  exit 0
fi

# Source-based coverage (clang's -fprofile-instr-generate) of the parsers'
# files, from replaying the seeds and the generated corpus; in a second build
# directory, as the instrumentation slows fuzzing down.
if ((coverage)); then
  cov=$build-cov
  if [[ ! -f $cov/build.ninja ]]; then
    cmake -S . -B "$cov" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER=clang++ -DDDP_BUILD_FUZZERS=ON -DDDP_USE_PCH=OFF \
      -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_TOOLS=OFF -DDDP_BUILD_BENCH=OFF \
      -DCMAKE_CXX_FLAGS="-fprofile-instr-generate -fcoverage-mapping"
  fi
  cmake --build "$cov" -j "${DDP_JOBS:-2}" --target idx_fuzzer checkpoint_fuzzer torch_load_fuzzer \
    flight_trace_fuzzer grad_scaler_state_fuzzer
  for t in "${targets[@]}"; do
    case $t in
      idx) sources=(src/datasets/idx.cc src/datasets/byte_reader.cc) ;;
      checkpoint) sources=(src/checkpoint/checkpoint_format.cc) ;;
      torch_load) sources=(src/checkpoint/torch_load.cc src/checkpoint/unpickler.cc) ;;
      flight_trace) sources=(src/flight/flight_trace.cc src/flight/flight_verdict.cc) ;;
      grad_scaler_state) sources=(src/amp/grad_scaler_state.cc) ;;
    esac
    mkdir -p "$out/$t/corpus"
    LLVM_PROFILE_FILE="$out/$t/coverage.profraw" "$cov/fuzz/${t}_fuzzer" -runs=0 \
      "$out/$t/corpus" "fuzz/corpus/$t" >"$out/$t/coverage.log" 2>&1
    llvm-profdata-14 merge -sparse "$out/$t/coverage.profraw" -o "$out/$t/coverage.profdata"
    echo "fuzz.sh: $t: coverage of $(find "$out/$t/corpus" "fuzz/corpus/$t" -type f | wc -l) inputs"
    llvm-cov-14 report "$cov/fuzz/${t}_fuzzer" -instr-profile="$out/$t/coverage.profdata" "${sources[@]}"
  done
  exit 0
fi

# LeakSanitizer stays on: an input that leaks is a finding too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=1:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/sanitizers/fuzz_lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  mkdir -p "$out/$t/corpus"
  log=$out/$t/fuzz.log
  echo "fuzz.sh: $t for $seconds s (log: $log)"
  # -timeout: one input running longer is reported as a hang.
  # -rss_limit_mb: the parsers' memory is bounded by the input and
  # IdxOptions::max_bytes; 2 GiB leaves room for ASan and libtorch.
  # shellcheck disable=SC2086
  if "$build/fuzz/${t}_fuzzer" "$out/$t/corpus" "fuzz/corpus/$t" \
      -dict="fuzz/$t.dict" -max_total_time="$seconds" -timeout="$timeout" \
      -rss_limit_mb=2048 -artifact_prefix="$out/$t/" -print_final_stats=1 \
      ${DDP_FUZZ_ARGS:-} >"$log" 2>&1; then
    grep -E '^(#[0-9]+[[:space:]]+DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)' "$log" || true
  else
    echo "fuzz.sh: $t FAILED; the last lines of $log:"
    tail -n 40 "$log"
    status=1
  fi
done
exit $status
