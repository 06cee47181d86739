// fully_shard: docs/fully_shard.md's snippets are parts of this program,
// verbatim up to their indentation (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/fully_shard
//
// Trains a small residual MLP with its four blocks and its root sharded
// across the ranks (AdamW, gradient clipping over the whole model), then
// gathers the full parameters. Exits 0 and rank 0 prints "fully_shard: ...
// identical on every rank" when every rank's gathered parameters agree and
// each rank held about 1/W of them.
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/relu.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <iostream>
#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  at::Tensor forward(at::Tensor x) { return x + torch::relu(fc(x)); }
  torch::nn::Linear fc;
};

struct NetImpl : torch::nn::Module {
  NetImpl() {
    inp = register_module("inp", torch::nn::Linear(examples::kFeatures, 32));
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       ddp::FullyShard<BlockImpl>(32)));
    }
    head = register_module("head", torch::nn::Linear(32, examples::kClasses));
  }
  at::Tensor forward(at::Tensor x) {
    x = inp(x);
    for (auto& b : blocks) x = b(x);
    return head(x);
  }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  std::vector<ddp::FullyShard<BlockImpl>> blocks;
};

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    const auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);

    torch::manual_seed(0);  // the same initial weights on every rank
    ddp::FullyShard<NetImpl> net;
    for (auto& b : net->blocks) ddp::fully_shard(b);  // inner units first
    ddp::fully_shard(net);                            // then the root
    torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-3));

    for (int epoch = 0; epoch < 2; ++epoch) {
      for (const examples::Batch& b : batches) {
        opt.zero_grad();
        torch::cross_entropy_loss(net(b.x), b.y).backward();  // averaged shards
        ddp::clip_grad_norm_(*net, 1.0);                      // the whole model's norm
        opt.step();
      }
    }
    auto full = ddp::full_state_dict(*net);  // every rank calls it; full tensors by name

    std::vector<at::Tensor> flat;
    for (const auto& kv : full) flat.push_back(kv.value().flatten());
    at::Tensor lo = at::cat(flat);
    at::Tensor hi = lo.clone();
    ddp::all_reduce(lo, ddp::ReduceOp::MIN);
    ddp::all_reduce(hi, ddp::ReduceOp::MAX);
    const bool same = lo.equal(hi);
    int64_t held = 0;
    for (const at::Tensor& p : net->parameters()) held += p.numel();
    ddp::print0f("fully_shard: rank 0 holds %lld of %lld parameter elements, full parameters %s",
                 static_cast<long long>(held), static_cast<long long>(lo.numel()),
                 same ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "fully_shard: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
