// ddprun's part of the flight recorder (ddp/flight_recorder.h): where its
// workers' rings go, and the verdict it prints when an attempt fails.
#pragma once

#include <string>
#include <vector>

#include "flight/flight_verdict.h"

namespace ddp::launcher {

// DDP_FLIGHT_RECORDER_DIR for the workers of the attempt whose files are in
// `attempt_dir`: "<attempt_dir>/flight" in ddprun's private run directory.
std::string flight_dir_of_attempt(const std::string& attempt_dir);

// After a failed or interrupted attempt: the verdict of
// src/flight/flight_verdict.h, told what ddprun knows (`facts`), over the
// rings in `dir` written by the processes `pids` (this node's workers; a
// directory the user shares between runs may hold older rings, left out;
// empty: every ring in `dir`),
// as lines for the console,
// and where the rings are kept. When `copy_to` is not empty (the run
// directory is temporary and goes with ddprun) the rings are first copied
// there; if that fails, *copy_failed is set and the text names `dir`,
// which the caller must then keep. "" when `dir` holds no ring (the program uses no ddp process
// group, or turned the recorder off) or the rings show no collective in the
// failure (flight::collective_involved: nothing is copied then). Never
// throws: a failure to read or copy is reported in the text.
std::string flight_report(const std::string& dir, const std::string& copy_to,
                          const std::vector<int>& pids, const flight::AttemptFacts& facts,
                          bool* copy_failed);

}  // namespace ddp::launcher
