// Compiled into every test binary of ddp_add_test (tests/CMakeLists.txt):
// the environment every test starts with, so that nothing a test runs
// writes outside the build. A test, or the environment, that sets one of
// these itself wins. Set before main(), while the process has one thread.
//  - DDP_FLIGHT_RECORDER_DIR: the flight recorder's rings
//    (ddp/flight_recorder.h) go to one directory of the build, not into the
//    tests' working directories, and a ddprun that a test starts copies
//    nothing into its own.
//  - TORCHINDUCTOR_CACHE_DIR: Python's torch (2.14 at least) creates
//    /tmp/torchinductor_<user> at a process's first backward unless this
//    names another directory; the oracles (tests/oracle/) train, so they
//    would leave it in /tmp (DDP_TEST_PYTHON_ENV in CMakeLists.txt says the
//    same for the examples' and benchmarks' Python runs).
#include <cstdlib>

namespace {
const int kFlightDirSet =
    ::setenv("DDP_FLIGHT_RECORDER_DIR", DDP_TEST_BIN_DIR "/test-flight-records", 0);
const int kInductorDirSet =
    ::setenv("TORCHINDUCTOR_CACHE_DIR", DDP_TEST_BIN_DIR "/torchinductor-cache", 0);
}  // namespace
