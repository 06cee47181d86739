// ddp-train: data-parallel training of a CNN on Fashion-MNIST.
//
//   ddprun --standalone --nproc-per-node 2 ddp-train [--epochs 10] ...
//
// See README.md ("The main job") and `ddp-train --help`.
#include <iostream>

#include "config.h"
#include "ddp/error.h"
#include "ddp/process_group.h"
#include "train.h"

int main(int argc, char** argv) {
  try {
    return ddp::train::run(ddp::train::parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::string rank = ddp::is_initialized() ? std::to_string(ddp::get_rank()) : "?";
    std::cerr << "[rank" << rank << "]: ddp-train failed: " << e.what() << std::endl;
    return 1;
  }
}
