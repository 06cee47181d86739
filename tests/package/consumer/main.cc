// Uses the installed ddp: reads the launch environment, then all-reduces on
// a world of one over memory://. Prints "consumer: ok ..." on success.
#include <ATen/ops/full.h>

#include <iostream>

#include "ddp/collectives.h"
#include "ddp/env.h"
#include "ddp/process_group.h"

int main() {
  try {
    const ddp::LaunchEnv env = ddp::read_launch_env();
    ddp::InitOptions options;
    options.init_method = "memory://consumer";
    options.rank = 0;
    options.world_size = 1;
    ddp::init_process_group(options);
    at::Tensor t = at::full({3}, 2.5, at::kFloat);
    ddp::all_reduce(t, ddp::ReduceOp::SUM);
    const bool ok = t.eq(2.5).all().item<bool>() && ddp::get_world_size() == 1;
    ddp::destroy_process_group();
    std::cout << "consumer: " << (ok ? "ok" : "WRONG") << " source " << ddp::to_string(env.source)
              << " rank " << env.rank << " world_size " << env.world_size << std::endl;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << std::endl;
    return 1;
  }
}
