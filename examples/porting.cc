// The seed's Python DDP recipe in C++, point by point (docs/porting.md
// quotes this file; examples/check_snippets.py checks the quotes). A small
// MLP on synthetic data, a few seconds on 2 CPU ranks:
//
//   ddprun --standalone --nproc-per-node 2 build/examples/porting
//   ddprun --standalone --nproc-per-node 2 build/examples/porting --no-find-unused-parameters
//
// Rank 0 alone prints: the loss every kLogEvery steps (averaged over the
// ranks), each epoch's loss over all samples, then "final loss X" and
// whether the replicas ended identical. The second command shows what ddp
// says where PyTorch raises "Expected to have finished reduction in the
// prior iteration": the model's `aux` head takes no part in the loss.
// Exit status: 0 when training finished and the replicas are identical.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/metrics.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

constexpr int kEpochs = 3;
constexpr int64_t kLogEvery = 8;  // steps between progress lines (the seed: 100)

// A body, the head the loss uses, and an auxiliary head it does not (a
// layer kept for later fine-tuning, say): the seed's point 9 in one model.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : body(register_module("body", torch::nn::Linear(examples::kFeatures, 32))),
        head(register_module("head", torch::nn::Linear(32, examples::kClasses))),
        aux(register_module("aux", torch::nn::Linear(32, 1))) {}
  at::Tensor forward(const at::Tensor& x) { return head(body(x).relu()); }

  torch::nn::Linear body, head, aux;
};
TORCH_MODULE(Net);

int run(int argc, char** argv) {
  // torch.distributed.launch passes --local_rank=N, torchrun and ddprun set
  // LOCAL_RANK: accept both (the flag is removed from argv).
  const std::optional<int> local_rank_flag = ddp::local_rank_from_argv(argc, argv);
  const bool find_unused = !(argc > 1 && std::strcmp(argv[1], "--no-find-unused-parameters") == 0);

  ddp::InitOptions init;
  init.backend = "gloo";          // "nccl" for CUDA tensors with a CUDA libtorch
  ddp::init_process_group(init);  // env://: RANK, WORLD_SIZE, MASTER_ADDR, ... from the launcher
  const int world_size = ddp::get_world_size();

  const int local_rank = local_rank_flag.value_or(ddp::get_local_rank());
  c10::Device device(c10::kCPU);  // cuda:local_rank where there are GPUs
  if (torch::cuda::is_available()) device = c10::Device(c10::kCUDA, local_rank);

  const int batch_size = 32;  // per process: the global batch is batch_size * world_size
  ddp::DistributedSampler sampler(examples::kDatasetSize);  // rank and world size from the group
  ddp::print0f("global batch %d = %d per process x %d processes", batch_size * world_size,
               batch_size, world_size);

  torch::manual_seed(0);  // the same initial weights on every rank
  Net net;
  net->to(device);

  ddp::DistributedDataParallelOptions options;
  options.find_unused_parameters = find_unused;  // `aux` gets no gradient
  if (device.is_cuda()) options.device_ids = {device};
  ddp::DistributedDataParallel<Net> model(net, options);  // broadcasts rank 0's weights
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  double final_loss = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    sampler.set_epoch(epoch);  // a new order each epoch, the same on every rank
    sampler.reset();           // (a data loader calls reset() itself)
    ddp::Metrics metrics;
    int64_t step = 0;
    for (const auto& batch : examples::batches_of(sampler.indices(), batch_size)) {
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(model(batch.x.to(device)), batch.y.to(device));
      loss.backward();  // gradients averaged over the ranks
      optimizer.step();
      metrics.add_mean("loss", loss.item<double>(), batch.y.size(0));
      if (++step % kLogEvery == 0) {
        // Collective: every rank calls it at the same step (the sampler gives
        // every rank the same number of batches).
        const double mean = ddp::all_reduce_mean(loss.item<double>());
        ddp::print0f("epoch %d step %lld: loss %.4f", epoch, static_cast<long long>(step), mean);
      }
    }
    const ddp::ReducedMetrics r = metrics.all_reduce();  // collective: the same on every rank
    final_loss = r.value("loss");
    ddp::print0f("epoch %d: loss %.4f over %lld samples", epoch, final_loss,
                 static_cast<long long>(r.at("loss").weight));
  }

  const bool same = examples::replicas_identical(*net);  // collective
  ddp::print0f("final loss %.4f", final_loss);
  ddp::print0f("parameters %s on all %d ranks", same ? "identical" : "DIFFERENT", world_size);
  ddp::destroy_process_group();
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "porting: " << e.what() << std::endl;
    ddp::record_error(e);  // for ddprun's and torchrun's failure summary
    return 1;
  }
}
