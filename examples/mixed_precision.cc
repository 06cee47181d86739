// Mixed precision: docs/mixed_precision.md's snippets are parts of this
// program, verbatim up to their indentation (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/mixed_precision
//
// Trains the examples' MLP under DistributedDataParallel three times: the
// forward in bfloat16 under autocast; in float16 under autocast with a
// GradScaler (on a CPU, as the same code runs on a GPU with c10::kCUDA);
// and the whole model in bfloat16 through DDP's own mixed_precision.
// Exits 0 and rank 0 prints "mixed_precision: ... identical" when every run
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

// The whole model in bfloat16 (parameters, inputs, activations), the
// gradients reduced in float32 and written into float32 .grad().
double ddp_bf16_step(ddp::DistributedDataParallel<Net>& model, torch::optim::SGD& opt,
                     const Batch& b) {
  opt.zero_grad();
  at::Tensor loss = torch::cross_entropy_loss(model(b.x), b.y);  // bfloat16
  loss.backward();
  opt.step();  // on the float32 parameters
  return loss.item<double>();
}

struct Run {
  double first_loss = 0, last_loss = 0;  // mean over the first, last epoch
  bool identical = false;                // parameters equal on every rank
};

// Three epochs of step(batch) -> loss; collective (replicas compared).
template <typename Step>
Run epochs(Net& net, const std::vector<Batch>& batches, Step step) {
  std::vector<double> epoch_loss;
  for (int epoch = 0; epoch < 3; ++epoch) {
    double sum = 0;
    for (const Batch& b : batches) sum += step(b);
    epoch_loss.push_back(sum / static_cast<double>(batches.size()));
  }
  return {epoch_loss.front(), epoch_loss.back(), examples::replicas_identical(*net)};
}

Run train_autocast(bool fp16, const std::vector<Batch>& batches) {
  Net net;
  ddp::DistributedDataParallel<Net> model(net);
  torch::optim::SGD opt(model.parameters(), 0.1);
  ddp::GradScaler scaler;
  return epochs(net, batches, [&](const Batch& b) {
    return fp16 ? fp16_step(model, opt, scaler, b) : bf16_step(model, opt, b);
  });
}

Run train_ddp_mixed_precision(const std::vector<Batch>& batches) {
  Net net;
  // C++, CPU and CUDA
  ddp::DistributedDataParallelOptions o;
  o.mixed_precision = ddp::MixedPrecision{at::kBFloat16, at::kFloat, at::kBFloat16};
  ddp::DistributedDataParallel<Net> model(net, o);
  torch::optim::SGD opt(model.parameters(), 0.1);
  return epochs(net, batches, [&](const Batch& b) { return ddp_bf16_step(model, opt, b); });
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    bool ok = true;
    std::vector<Run> runs;
    runs.push_back(train_autocast(/*fp16=*/false, batches));
    runs.push_back(train_autocast(/*fp16=*/true, batches));
    runs.push_back(train_ddp_mixed_precision(batches));
    for (const Run& r : runs) ok = ok && r.identical && r.last_loss < r.first_loss;
    ddp::print0f("mixed_precision: autocast bfloat16 loss %.3f -> %.3f, autocast float16 with "
                 "GradScaler %.3f -> %.3f, DDP mixed_precision bfloat16 %.3f -> %.3f; "
                 "parameters %s",
                 runs[0].first_loss, runs[0].last_loss, runs[1].first_loss, runs[1].last_loss,
                 runs[2].first_loss, runs[2].last_loss,
                 ok ? "identical on every rank" : "DIFFER across ranks or did not learn");
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "mixed_precision: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
