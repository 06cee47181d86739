#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${DDP_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "${DDP_TEST_JOBS:-2}" "$@"
