// ddp-train: data-parallel training of a CNN on Fashion-MNIST.
//
//   ddprun --standalone --nproc-per-node 2 ddp-train [--epochs 10] ...
//
// See README.md ("The main job") and `ddp-train --help`.
#include "config.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "train.h"

int main(int argc, char** argv) {
  try {
    return ddp::train::run(ddp::train::parse_args(argc, argv));
  } catch (const std::exception& e) {
    ddp::log(ddp::LogLevel::kError, std::string("ddp-train failed: ") + e.what());
    ddp::record_error(e);  // the launcher's failure summary (TORCHELASTIC_ERROR_FILE)
    return 1;
  }
}
