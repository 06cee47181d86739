// What the examples share: synthetic data, a small model, and a check that
// the replicas ended identical. Not part of ddp's API; it keeps the example
// programs down to the code the documentation quotes.
//
// The data: kDatasetSize samples of kFeatures standard-normal features,
// labelled by the argmax of a fixed random linear map (kClasses classes), so
// a two-layer MLP learns them in a few hundred steps. Every rank builds the
// same dataset from its own generator (fixed seed), as every rank of a real
// job reads the same files; the sampler then gives each rank its share.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <c10/util/ArrayRef.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ddp/collectives.h"

namespace examples {

inline constexpr int64_t kDatasetSize = 1024;
inline constexpr int64_t kFeatures = 16;
inline constexpr int64_t kClasses = 4;

// x: N x kFeatures float32; y: N int64 class indices in [0, kClasses).
struct Batch {
  at::Tensor x;
  at::Tensor y;
};

// The whole dataset, built once per process (thread-safe: a function-local
// static), identical on every rank and in every run.
inline const Batch& dataset() {
  static const Batch data = [] {
    at::Generator gen = at::detail::createCPUGenerator(1234);
    at::Tensor x = at::randn({kDatasetSize, kFeatures}, gen);
    at::Tensor w = at::randn({kFeatures, kClasses}, gen);
    return Batch{x, x.matmul(w).argmax(1)};
  }();
  return data;
}

// The samples `indices` (each in [0, kDatasetSize)) in batches of
// `batch_size` (> 0), in order; the last batch holds the remainder.
inline std::vector<Batch> batches_of(const std::vector<int64_t>& indices, int64_t batch_size) {
  const Batch& all = dataset();
  std::vector<Batch> out;
  const auto n = static_cast<int64_t>(indices.size());
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t len = std::min(batch_size, n - begin);
    at::Tensor idx = torch::tensor(c10::ArrayRef<int64_t>(indices).slice(begin, len));
    out.push_back({all.x.index_select(0, idx), all.y.index_select(0, idx)});
  }
  return out;
}

// Linear(kFeatures, 32), ReLU, Linear(32, kClasses): N x kFeatures -> N x
// kClasses logits.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).relu()); }

  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// Collective (every rank of the default group calls it): true on every rank
// when every rank's parameters equal rank 0's bit for bit (an element-wise
// MIN and MAX over the ranks agree). The parameters must share one dtype
// and device (concatenated into one tensor for two all_reduces).
inline bool replicas_identical(const torch::nn::Module& model) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : model.parameters()) flat.push_back(p.detach().flatten());
  at::Tensor lo = at::cat(flat);
  at::Tensor hi = lo.clone();
  ddp::all_reduce(lo, ddp::ReduceOp::MIN);
  ddp::all_reduce(hi, ddp::ReduceOp::MAX);
  return lo.equal(hi);
}

}  // namespace examples
