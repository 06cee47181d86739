// Compiled into every test binary of ddp_add_test (tests/CMakeLists.txt):
// the flight recorder's rings (ddp/flight_recorder.h) go to one directory
// of the build, not into the tests' working directories, and a ddprun that
// a test starts copies nothing into its own. A test, or the environment,
// that sets DDP_FLIGHT_RECORDER_DIR itself wins. Set before main(), while
// the process has one thread.
#include <cstdlib>

namespace {
const int kFlightDirSet =
    ::setenv("DDP_FLIGHT_RECORDER_DIR", DDP_TEST_BIN_DIR "/test-flight-records", 0);
}  // namespace
