// The benchmark's workloads, built identically by ddp-bench (C++) and
// bench/python_ddp.py (PyTorch's Python DDP): same modules, same parameter
// names and shapes, same synthetic data for the same seed.
//
//   mlp          784-1024-1024-10 with ReLU (1.86 M parameters), batch 64
//   cnn          ddp-train's Fashion-MNIST CNN (tools/ddp-train/model.h),
//                batch 64, input N x 1 x 28 x 28
//   transformer  6 torch::nn::TransformerEncoderLayer (d_model 256, 4 heads,
//                feed-forward 1024, dropout 0.1, ReLU), mean over the
//                sequence, a 10-way linear head; sequence 64, batch 16,
//                input S x N x E (PyTorch's batch_first=false layout)
// tiny: much smaller sizes of each, for the smoke test only.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/fully_shard.h"

namespace ddp::bench {

// Sizes of a workload. Everything is float32 on the CPU.
struct WorkloadShape {
  std::string name;
  int64_t batch = 0;                 // per rank
  std::vector<int64_t> input;        // one batch's input shape
  int64_t classes = 10;
  // mlp
  int64_t hidden = 0;
  // transformer
  int64_t layers = 0, d_model = 0, heads = 0, feedforward = 0, seq = 0;
};

// Throws ddp::InvalidArgument for an unknown name. batch <= 0: the default.
WorkloadShape workload_shape(const std::string& name, bool tiny, int64_t batch);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const WorkloadShape& s);
  at::Tensor forward(at::Tensor x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

struct TransformerNetImpl : torch::nn::Module {
  explicit TransformerNetImpl(const WorkloadShape& s);
  at::Tensor forward(at::Tensor x);  // S x N x E -> N x classes
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerNet);

// The fully_shard variants (ddp-bench --fully-shard): the same modules and
// parameter names, with fully_shard units where FSDP2 users put them: each
// encoder layer of the transformer, then the root; the MLP as one unit.
struct ShardedEncoderImpl : torch::nn::Module {
  explicit ShardedEncoderImpl(const WorkloadShape& s);
  at::Tensor forward(at::Tensor x);
  std::vector<FullyShard<torch::nn::TransformerEncoderLayerImpl>> layers;  // "layers.N"
};
TORCH_MODULE(ShardedEncoder);

struct ShardedTransformerNetImpl : torch::nn::Module {
  explicit ShardedTransformerNetImpl(const WorkloadShape& s);
  at::Tensor forward(at::Tensor x);  // as TransformerNetImpl's
  ShardedEncoder encoder{nullptr};
  torch::nn::Linear head{nullptr};
};
using ShardedTransformerNet = FullyShard<ShardedTransformerNetImpl>;
using ShardedMlp = FullyShard<MlpImpl>;

// fully_shard on the units, inner ones first, then the root; an
// output_dtype applies to the root only (its own layers read the inner
// units' outputs in param_dtype).
void shard_model(ShardedTransformerNet& net, const FullyShardOptions& options);
void shard_model(ShardedMlp& net, const FullyShardOptions& options);

// A fixed pool of synthetic batches (input ~ N(0,1), labels uniform in
// [0, classes)), drawn from the default CPU generator seeded with `seed`:
// for each batch randn(input) then randint(classes, {batch}), exactly as
// python_ddp.py draws them, so both sides train on the same numbers.
std::vector<std::pair<at::Tensor, at::Tensor>> make_batches(const WorkloadShape& s,
                                                            int count, uint64_t seed);

}  // namespace ddp::bench
