// SyncBatchNorm: docs/sync_batchnorm.md's snippets are parts of this
// program, verbatim up to their indentation (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/sync_batchnorm
//
// Trains an MLP with two BatchNorm layers, one converted by
// convert_sync_batchnorm (a Sequential element) and one declared as
// ddp::SyncBatchNorm (a field of the model), with broadcast_buffers off:
// the running statistics still end identical on every rank, because every
// rank normalizes with the statistics of the whole group's batch. Exits 0
// and rank 0 prints "sync_batchnorm: ... identical" when the loss fell and
// every rank holds the same parameters and running statistics, bit for bit.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "ddp/sync_batchnorm.h"
#include "synthetic.h"

namespace {

using examples::Batch;
using examples::kClasses;
using examples::kFeatures;

struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    // A Sequential's BatchNorm: convert_sync_batchnorm can swap it.
    features = register_module("features", torch::nn::Sequential(
        torch::nn::Linear(kFeatures, 32), torch::nn::BatchNorm1d(32), torch::nn::ReLU()));
    // A field is called directly by forward(): declare it SyncBatchNorm.
    fc = register_module("fc", torch::nn::Linear(32, 32));
    bn = register_module("bn", ddp::SyncBatchNorm(32));
    head = register_module("head", torch::nn::Linear(32, kClasses));
  }
  at::Tensor forward(const at::Tensor& x) {
    return head(bn(fc(features->forward(x))).relu());
  }

  torch::nn::Sequential features{nullptr};
  torch::nn::Linear fc{nullptr}, head{nullptr};
  ddp::SyncBatchNorm bn{nullptr};
};
TORCH_MODULE(BnNet);

// Collective: whether every rank's running statistics equal rank 0's.
bool buffers_identical(const torch::nn::Module& model) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& b : model.buffers()) flat.push_back(b.to(at::kDouble).flatten());
  at::Tensor lo = at::cat(flat);
  at::Tensor hi = lo.clone();
  ddp::all_reduce(lo, ddp::ReduceOp::MIN);
  ddp::all_reduce(hi, ddp::ReduceOp::MAX);
  return lo.equal(hi);
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    BnNet net;
    int converted = ddp::convert_sync_batchnorm(*net);  // features.1
    ddp::DistributedDataParallelOptions options;
    options.broadcast_buffers = false;  // SyncBatchNorm keeps them equal
    ddp::DistributedDataParallel<BnNet> model(net, options);

    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    torch::optim::SGD opt(model.parameters(), 0.1);
    std::vector<double> epoch_loss;
    for (int epoch = 0; epoch < 3; ++epoch) {
      double sum = 0;
      for (const Batch& b : batches) {
        opt.zero_grad();
        at::Tensor loss = torch::cross_entropy_loss(model(b.x), b.y);
        loss.backward();
        opt.step();
        sum += loss.item<double>();
      }
      epoch_loss.push_back(sum / static_cast<double>(batches.size()));
    }
    const bool identical = examples::replicas_identical(*net) && buffers_identical(*net);
    const bool learned = epoch_loss.back() < epoch_loss.front();
    ddp::print0f("sync_batchnorm: %d layer converted, loss %.3f -> %.3f; parameters and "
                 "running statistics %s",
                 converted, epoch_loss.front(), epoch_loss.back(),
                 identical ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return identical && learned && converted == 1 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "sync_batchnorm: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
