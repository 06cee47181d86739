// Mixed precision: docs/mixed_precision.md's snippets are parts of this
// program, verbatim up to their indentation (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/mixed_precision
//
// Trains the examples' MLP under DistributedDataParallel twice: the forward
// in bfloat16 under autocast, and in float16 under autocast with a
// GradScaler (on a CPU, as the same code runs on a GPU with c10::kCUDA).
// Exits 0 and rank 0 prints "mixed_precision: ... identical" when both runs
// learned (the loss fell) and left every rank with the same parameters.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <vector>

#include "ddp/autocast.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/grad_scaler.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

using examples::Batch;
using examples::Net;

// bfloat16: autocast alone (bfloat16 has float32's range: no scaler).
double bf16_step(ddp::DistributedDataParallel<Net>& model, torch::optim::SGD& opt,
                 const Batch& b) {
  opt.zero_grad();
  at::Tensor loss;
  {
    ddp::AutocastGuard autocast(c10::kCPU, at::kBFloat16);
    loss = torch::cross_entropy_loss(model(b.x), b.y);  // logits bfloat16, loss float32
  }
  loss.backward();  // outside the scope, as in Python
  opt.step();
  return loss.item<double>();
}

// float16: autocast and a GradScaler, clipping the unscaled gradients.
double fp16_step(ddp::DistributedDataParallel<Net>& model, torch::optim::SGD& opt,
                 ddp::GradScaler& scaler, const Batch& b) {
  opt.zero_grad();
  at::Tensor loss;
  {
    ddp::AutocastGuard autocast(c10::kCPU, at::kHalf);
    loss = torch::cross_entropy_loss(model(b.x), b.y);
  }
  scaler.scale(loss).backward();
  scaler.unscale_(opt);
  torch::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
  scaler.step(opt);  // skipped when a gradient is inf or NaN
  scaler.update();
  return loss.item<double>();
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    bool identical = true;
    std::vector<std::pair<double, double>> losses;
    for (bool fp16 : {false, true}) {
      Net net;
      ddp::DistributedDataParallel<Net> model(net);
      torch::optim::SGD opt(model.parameters(), 0.1);
      ddp::GradScaler scaler;
      std::vector<double> epoch_loss;
      for (int epoch = 0; epoch < 3; ++epoch) {
        double sum = 0;
        for (const Batch& b : batches) {
          sum += fp16 ? fp16_step(model, opt, scaler, b) : bf16_step(model, opt, b);
        }
        epoch_loss.push_back(sum / static_cast<double>(batches.size()));
      }
      losses.emplace_back(epoch_loss.front(), epoch_loss.back());
      identical = identical && examples::replicas_identical(*net);  // collective
    }
    const bool learned = losses[0].second < losses[0].first && losses[1].second < losses[1].first;
    ddp::print0f("mixed_precision: bfloat16 loss %.3f -> %.3f, float16 with GradScaler %.3f -> "
                 "%.3f; parameters %s",
                 losses[0].first, losses[0].second, losses[1].first, losses[1].second,
                 identical ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return identical && learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "mixed_precision: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
