// A ddp program for ddprun's multi-node tests: joins the job from the
// environment (ddp::init_process_group, env://), then for each step
// all_reduces ones*(rank+1) and checks the sum, printing
// "rank R world W step S sum X". Arguments: steps, seconds per step,
// timeout of each all_reduce in ms.
#include <ATen/ops/ones.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "ddp/collectives.h"
#include "ddp/process_group.h"

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  const double step_s = argc > 2 ? std::atof(argv[2]) : 0.05;
  const long timeout_ms = argc > 3 ? std::atol(argv[3]) : 60000;
  try {
    // The rendezvous waits for every rank to start (slow on a loaded
    // machine); only the collectives get the test's short timeout.
    ddp::InitOptions options;
    options.timeout = std::chrono::minutes(2);
    ddp::init_process_group(options);
    ddp::CollectiveOptions collective;
    collective.timeout = std::chrono::milliseconds(timeout_ms);
    const int rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    const float expected = world * (world + 1) / 2.0f;
    for (int step = 1; step <= steps; ++step) {
      at::Tensor t = at::ones({4}) * static_cast<float>(rank + 1);
      ddp::all_reduce(t, ddp::ReduceOp::SUM, collective);
      const float got = t.min().item<float>();
      if (got != expected || t.max().item<float>() != expected) {
        std::fprintf(stderr, "rank %d step %d: all_reduce gave %f, expected %f\n", rank, step,
                     got, expected);
        return 2;
      }
      std::printf("rank %d world %d step %d sum %g\n", rank, world, step, got);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
    }
    ddp::barrier();  // rank 0 hosts the store: nobody leaves early
    ddp::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_worker: %s\n", e.what());
    std::fflush(nullptr);
    // Not `return`: after a failed collective the process group's
    // destructor can block on a dead peer (Gloo threads stuck in send).
    std::_Exit(1);
  }
  return 0;
}
