// ZeroRedundancyOptimizer: docs/zero_redundancy_optimizer.md's snippets are
// parts of this program, verbatim up to their indentation
// (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/zero_redundancy DIR
//
// Trains the examples' MLP with Adam sharded across the ranks, on uneven
// inputs (rank r has 4 + 3r batches) under ddp::join, and saves a
// checkpoint to DIR; run again with the same DIR and it resumes from it
// (the full optimizer state, re-sharded for this run's world size). Exits 0
// and rank 0 prints "zero_redundancy: ... identical" when every rank ends
// with the same parameters and the ranks' state adds up to Adam's whole.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "synthetic.h"

namespace {

using examples::Batch;
using examples::Net;

// Two epochs over this rank's batches, however many; returns when every
// rank has finished.
void train(ddp::DistributedDataParallel<Net>& model, ddp::ZeroRedundancyOptimizer& opt,
           const std::vector<Batch>& my_batches) {
  ddp::join(model, {&opt}, [&] {
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (const Batch& b : my_batches) {
        opt.zero_grad();
        torch::cross_entropy_loss(model(b.x), b.y).backward();
        opt.step();  // this rank's shard, then every shard is broadcast
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 2) throw ddp::InvalidArgument("usage: zero_redundancy CHECKPOINT_DIR");
    const std::string dir = argv[1];
    ddp::init_process_group();
    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    batches.resize(std::min<size_t>(batches.size(), 4 + 3 * ddp::get_rank()));

    Net net;
    ddp::DistributedDataParallel<Net> model(net);
    ddp::ZeroRedundancyOptimizer opt(model.parameters(), torch::optim::AdamOptions(1e-3));

    int64_t epoch = 0;
    if (auto ckpt = ddp::load_latest_checkpoint(dir, at::kCPU)) {  // collective
      ddp::restore_checkpoint(*ckpt, *model.module(), &opt);  // keeps this rank's shard
      epoch = ckpt->epoch;
      ddp::log0(ddp::LogLevel::kInfo, "resumed at epoch " + std::to_string(epoch));
    }
    train(model, opt, batches);
    // Gathers the shards on rank 0, which writes the full Adam state.
    ddp::save_checkpoint(dir, *model.module(), &opt, epoch + 2, 0);  // collective

    int64_t total = 0;
    for (int64_t b : ddp::all_gather_value(opt.state_bytes())) total += b;
    const bool same = examples::replicas_identical(*net);  // collective
    ddp::print0f("zero_redundancy: rank 0 holds %lld of %lld optimizer-state bytes; "
                 "parameters %s",
                 static_cast<long long>(opt.state_bytes()), static_cast<long long>(total),
                 same ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "zero_redundancy: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
