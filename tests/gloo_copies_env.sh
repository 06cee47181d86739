#!/usr/bin/env bash
# Every "@gloo" copy of a test (tests/CMakeLists.txt) runs with DDP_SHM=0:
# the copies exist to prove the results on Gloo's path, and a property list
# that gtest_discover_tests flattened wrongly once left them on shared
# memory without any test failing.
#   gloo_copies_env.sh <ctest> <build dir>
set -euo pipefail
listing=$("$1" --test-dir "$2" -N -V -R '@gloo$')
copies=$(grep -cE '^ *Test +#[0-9]+: .*@gloo$' <<<"$listing" || true)
with_env=$(grep -cE '^[0-9]+: +DDP_SHM=0$' <<<"$listing" || true)
echo "@gloo copies: $copies; with DDP_SHM=0: $with_env"
if [ "$copies" -eq 0 ] || [ "$copies" -ne "$with_env" ]; then
  echo "gloo_copies_env: some @gloo copies lack DDP_SHM=0 in their environment:" >&2
  echo "check PROPERTIES of the @gloo gtest_discover_tests in tests/CMakeLists.txt" >&2
  exit 1
fi
