// ddprun's job: run the worker group, restart it after failures while
// --max-restarts allows, and on more than one node agree with the other
// nodes' launchers on every start and stop (control.h).
//
// Thread safety: call once, from the main thread, before starting threads.
#pragma once

#include "launcher/options.h"

namespace ddp::launcher {

// Exit codes of ddprun.
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;  // a worker failed, a launch error
inline constexpr int kExitUsage = 2;    // a bad command line
// 128 + N after stop signal N (130 for SIGINT, 143 for SIGTERM).

// Runs the job described by `options` and returns ddprun's exit code. Prints
// its own messages ("ddprun: ...") and the failure summary on stderr; never
// throws (errors become a message and kExitFailure).
int run_launcher(const LaunchOptions& options);

}  // namespace ddp::launcher
