// ddp-train: data-parallel training of a CNN on Fashion-MNIST.
//
//   ddprun --standalone --nproc-per-node 2 ddp-train [--epochs 10] ...
//
// See README.md ("The main job") and `ddp-train --help`.
#include <cstdio>
#include <string>

#include "config.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "train.h"

int main(int argc, char** argv) {
  ddp::train::TrainConfig config;
  try {
    config = ddp::train::parse_args(argc, argv);
  } catch (const ddp::train::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    ddp::record_error(e);  // the launcher's failure summary (TORCHELASTIC_ERROR_FILE)
    return 2;
  } catch (const std::exception& e) {  // --local_rank's own check (ddp/env.h)
    std::fprintf(stderr, "ddp-train: error: %s (see ddp-train --help)\n", e.what());
    ddp::record_error(e);
    return 2;
  }
  try {
    return ddp::train::run(config);
  } catch (const std::exception& e) {
    // ddp-train's own messages start with "ddp-train: "; the library's
    // (a collective's timeout, a checkpoint's error) are said to be its.
    const std::string what = e.what();
    ddp::log(ddp::LogLevel::kError, what.rfind("ddp-train: ", 0) == 0 ? what : "ddp-train: " + what);
    ddp::record_error(e);  // the launcher's failure summary (TORCHELASTIC_ERROR_FILE)
    return 1;
  }
}
