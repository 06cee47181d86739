// Gradient accumulation with no_sync(): README's "Gradient accumulation"
// snippet is the body of accumulate_step below, verbatim up to its
// indentation (examples/check_snippets.py checks it).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/no_sync
//
// Checks what the snippet promises: K micro-batches, of which only the last
// backward communicates, give the same step as one synchronised backward
// over the K micro-batches concatenated (each loss divided by K, so the sum
// of the K means is the mean over all; equal micro-batch sizes), and only
// the last backward synchronised (DdpStats::iterations). Exits 0 and rank 0
// prints "no_sync: ... same parameters" when they agree within 1e-6 on
// every rank.
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/full.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <iostream>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

using examples::Net;
using Model = ddp::DistributedDataParallel<Net>;

at::Tensor loss_fn(const at::Tensor& logits, const at::Tensor& target) {
  return torch::cross_entropy_loss(logits, target);
}

// One optimizer step over K micro-batches x[k], y[k] (K >= 1).
void accumulate_step(Model& model, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& x,
                     const std::vector<at::Tensor>& y, int K) {
  opt.zero_grad();
  for (int k = 0; k < K - 1; ++k) {
    auto guard = model.no_sync();                  // this forward: local only
    (loss_fn(model(x[k]), y[k]) / K).backward();
  }
  (loss_fn(model(x[K - 1]), y[K - 1]) / K).backward();  // averages all K
  opt.step();
}

// The same step as one synchronised backward over the concatenation.
void one_big_step(Model& model, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& x,
                  const std::vector<at::Tensor>& y) {
  opt.zero_grad();
  loss_fn(model(at::cat(x)), at::cat(y)).backward();
  opt.step();
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    constexpr int K = 4;
    const auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    std::vector<at::Tensor> x, y;
    for (int k = 0; k < K; ++k) {
      x.push_back(batches.at(k).x);
      y.push_back(batches.at(k).y);
    }
    // Two replicas of the same model (the wrappers broadcast rank 0's
    // weights; the copy starts from the same ones).
    Net a, b;
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < a->parameters().size(); ++i) {
        b->parameters()[i].copy_(a->parameters()[i]);
      }
    }
    Model model_a(a), model_b(b);
    torch::optim::SGD opt_a(model_a.parameters(), 0.1), opt_b(model_b.parameters(), 0.1);
    accumulate_step(model_a, opt_a, x, y, K);
    one_big_step(model_b, opt_b, x, y);

    bool close = true;
    for (size_t i = 0; i < a->parameters().size(); ++i) {
      close = close && a->parameters()[i].allclose(b->parameters()[i], 0, 1e-6);
    }
    at::Tensor bad = at::full({1}, close ? 0.0 : 1.0);
    ddp::all_reduce(bad, ddp::ReduceOp::MAX);  // every rank's verdict
    // Only the last of the K backward passes communicated.
    const bool one_sync = model_a.stats().iterations == 1;
    const bool ok = bad.item<double>() == 0.0 && one_sync && examples::replicas_identical(*a);
    ddp::print0f("no_sync: %d micro-batches then one synchronised backward: %s", K,
                 ok ? "same parameters as one large batch" : "DIFFERENT parameters");
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "no_sync: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
