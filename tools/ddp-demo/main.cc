// ddp-demo: the smallest ddp program. Every rank all-reduces a tensor
// holding its rank + 1 (rank 0 prints the sum, which must be W(W+1)/2), then
// takes one DistributedDataParallel step on a Linear(4, 1) whose input on
// rank r is r + 1: the averaged weight gradient must be (W + 1) / 2 on every
// rank.
//
//   ddprun --standalone --nproc-per-node 2 ddp-demo
//   torchrun --nproc-per-node 2 --no-python ddp-demo
#include <ATen/ops/full.h>
#include <torch/nn/modules/linear.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <limits>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"

namespace {

// One DDP step; true when the weight gradient is the average over ranks.
// DDP divides each rank's gradient by W before the sum (as PyTorch), so
// (r + 1) / W is rounded on each rank and the sum of W such terms may be
// off by a few units in the last place (e.g. W = 6): allow W ulps, no more.
bool ddp_step(int rank, int world) {
  torch::nn::Linear linear(4, 1);
  ddp::DistributedDataParallel<torch::nn::Linear> model(linear);
  at::Tensor x = at::full({1, 4}, static_cast<double>(rank + 1), at::kFloat);
  model(x).sum().backward();
  // d(sum(w.x + b))/dw = x; its average over the ranks is (W + 1) / 2.
  const double expect = (world + 1) / 2.0;
  const double tolerance = world * expect * std::numeric_limits<float>::epsilon();
  return (model.module()->weight.grad() - expect).abs().max().item<double>() <= tolerance;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ddp::local_rank_from_argv(argc, argv);  // accepted, as torch.distributed.launch passes it
    CLI::App app{
        "ddp-demo: the smallest ddp program (an all_reduce and one "
        "DistributedDataParallel step). Run it on several ranks:\n"
        "  ddprun --standalone --nproc-per-node 2 ddp-demo\n"
        "  torchrun --nproc-per-node 2 --no-python ddp-demo"};
    CLI11_PARSE(app, argc, argv);

    ddp::init_process_group();
    const int rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    at::Tensor t = at::full({4}, static_cast<double>(rank + 1), at::kFloat);
    ddp::all_reduce(t);
    const double expect = world * (world + 1) / 2.0;
    const bool sum_ok = t.eq(expect).all().item<bool>();
    if (rank == 0) {
      std::cout << "ddp-demo: world_size " << world << ", all_reduce sum " << t[0].item<double>()
                << (sum_ok ? " (correct)" : " (WRONG)") << std::endl;
    }
    // Every rank's verdict, so that rank 0 reports a wrong gradient anywhere.
    at::Tensor bad = at::full({1}, ddp_step(rank, world) ? 0.0 : 1.0, at::kFloat);
    ddp::all_reduce(bad);
    const bool step_ok = bad.item<double>() == 0.0;
    if (rank == 0) {
      std::cout << "ddp-demo: DDP step, gradients averaged over " << world << " ranks"
                << (step_ok ? " (correct)" : " (WRONG)") << std::endl;
    }
    ddp::barrier();
    ddp::destroy_process_group();
    return sum_ok && step_ok ? 0 : 1;
  } catch (const std::exception& e) {
    // ddp's logging: "[rankN]: ERROR: ..." (the launch environment's rank
    // before a group exists), or ddprun's prefix.
    ddp::log(ddp::LogLevel::kError, std::string("ddp-demo: ") + e.what());
    ddp::record_error(e);
    return 1;
  }
}
