// Uneven inputs with ddp::join: README's "Uneven inputs" snippet is the
// body of train_uneven below, verbatim up to its indentation
// (examples/check_snippets.py checks it).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/join
//
// Rank r trains on 2 + 3r batches, so rank 0 runs out first and shadows the
// others' all_reduces until they finish. Without join, rank 0 would leave
// while rank 1 waits in its next all_reduce (until the timeout). Exits 0
// and rank 0 prints "join: ... identical" when every rank ends with the
// same parameters, bit for bit.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

using examples::Batch;
using examples::Net;

at::Tensor loss_fn(const at::Tensor& logits, const at::Tensor& target) {
  return torch::cross_entropy_loss(logits, target);
}

// Trains on this rank's batches, however many; returns when every rank has.
void train_uneven(ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& opt,
                  const std::vector<Batch>& my_batches) {
  ddp::join(model, [&] {
    for (auto& b : my_batches) { opt.zero_grad(); loss_fn(model(b.x), b.y).backward(); opt.step(); }
  });
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    const int rank = ddp::get_rank();
    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    batches.resize(std::min<size_t>(batches.size(), 2 + 3 * rank));  // uneven: 2, 5, 8, ...
    Net net;
    ddp::DistributedDataParallel<Net> model(net);
    torch::optim::SGD opt(model.parameters(), 0.1);
    train_uneven(model, opt, batches);
    const bool same = examples::replicas_identical(*net);  // collective
    ddp::print0f("join: %d ranks trained on different numbers of batches; parameters %s",
                 ddp::get_world_size(), same ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "join: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
