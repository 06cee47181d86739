// Communication hooks: docs/comm_hooks.md's snippets are parts of this
// program, verbatim up to their indentation (examples/check_snippets.py).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/comm_hooks
//
// Trains the examples' MLP four times: with the built-in float16 hook,
// with float16 through a hook that counts the bytes it hands to all_reduce, with a
// hand-written hook that clips the averaged gradients, and with PowerSGD.
// Each run starts from new random weights (the global generator advances),
// so their losses differ for that reason too. Exits 0 and rank 0
// prints "comm_hooks: ... identical" when every run learned (the loss fell) and left every rank
// with the same parameters, bit for bit.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <memory>
#include <vector>

#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp/powersgd.h"
#include "ddp/process_group.h"
#include "synthetic.h"

namespace {

using examples::Batch;
using examples::Net;

// Averages in float16, counting the bytes each rank hands to all_reduce.
struct WireBytes {
  int64_t bytes = 0;
};

ddp::BucketWork counted_fp16(WireBytes& wire, ddp::GradBucket& bucket) {
  wire.bytes += bucket.buffer.numel() * 2;  // float16: 2 bytes per element
  return ddp::fp16_compress_hook(bucket);
}

// The average, then clipped to [-1, 1] on every rank alike.
ddp::BucketWork clipped_allreduce(ddp::GradBucket& bucket) {
  return ddp::allreduce_hook(bucket).then([](at::Tensor avg) { return avg.clamp_(-1.0, 1.0); });
}

// Trains a fresh Net for 3 epochs with `register_hook` applied to its
// wrapper; returns the first and last epoch's mean loss on this rank.
template <typename Register>
std::pair<double, double> train(const std::vector<Batch>& batches, Register register_hook,
                                bool& identical) {
  Net net;
  ddp::DistributedDataParallel<Net> model(net);
  register_hook(model);
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
  identical = identical && examples::replicas_identical(*net);  // collective
  return {epoch_loss.front(), epoch_loss.back()};
}

}  // namespace

int main() {
  try {
    ddp::init_process_group();
    auto batches = examples::batches_of(
        ddp::distributed_sampler_indices(examples::kDatasetSize, {}, 0), 16);
    bool identical = true;
    auto builtin = train(batches, [&](ddp::DistributedDataParallel<Net>& model) {
      model.register_comm_hook(ddp::fp16_compress_hook, "fp16_compress");
    }, identical);
    auto wire = std::make_shared<WireBytes>();
    auto fp16 = train(batches, [&](ddp::DistributedDataParallel<Net>& model) {
      model.register_comm_hook(wire, counted_fp16, "counted fp16");
    }, identical);
    auto clipped = train(batches, [&](ddp::DistributedDataParallel<Net>& model) {
      model.register_comm_hook(clipped_allreduce, "clipped allreduce");
    }, identical);
    auto powersgd = train(batches, [&](ddp::DistributedDataParallel<Net>& model) {
      ddp::PowerSGDOptions o;
      o.matrix_approximation_rank = 2;
      o.start_powerSGD_iter = 10;
      auto state = std::make_shared<ddp::PowerSGDState>(o);
      model.register_comm_hook(state, ddp::powerSGD_hook, "powerSGD");
    }, identical);
    const bool learned = builtin.second < builtin.first && fp16.second < fp16.first &&
                         clipped.second < clipped.first && powersgd.second < powersgd.first;
    ddp::print0f("comm_hooks: fp16 loss %.3f -> %.3f, counted fp16 %.3f -> %.3f (%lld bytes "
                 "per rank handed to all_reduce), clipped %.3f -> %.3f, PowerSGD %.3f -> %.3f; parameters %s",
                 builtin.first, builtin.second, fp16.first, fp16.second,
                 static_cast<long long>(wire->bytes), clipped.first, clipped.second,
                 powersgd.first, powersgd.second,
                 identical ? "identical on every rank" : "DIFFER across ranks");
    ddp::destroy_process_group();
    return identical && learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "comm_hooks: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
