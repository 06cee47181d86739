#include "models.h"

#include <ATen/Context.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <fmt/format.h>
#include <torch/nn/modules/transformerlayer.h>

#include "ddp/error.h"

namespace ddp::bench {

WorkloadShape workload_shape(const std::string& name, bool tiny, int64_t batch) {
  WorkloadShape s;
  s.name = name;
  if (name == "mlp") {
    s.batch = tiny ? 8 : 64;
    s.hidden = tiny ? 32 : 1024;
    s.input = {784};
  } else if (name == "cnn") {
    s.batch = tiny ? 4 : 64;
    s.input = {1, 28, 28};
  } else if (name == "transformer") {
    s.batch = tiny ? 2 : 16;
    s.layers = tiny ? 1 : 6;
    s.d_model = tiny ? 32 : 256;
    s.heads = tiny ? 2 : 4;
    s.feedforward = tiny ? 64 : 1024;
    s.seq = tiny ? 8 : 64;
  } else {
    throw InvalidArgument(fmt::format(
        "--workload '{}' is unknown: use mlp, cnn or transformer", name));
  }
  if (batch > 0) s.batch = batch;
  if (name == "transformer") {
    s.input = {s.seq, s.batch, s.d_model};  // the batch is dimension 1
  } else {
    s.input.insert(s.input.begin(), s.batch);
  }
  return s;
}

MlpImpl::MlpImpl(const WorkloadShape& s) {
  fc1 = register_module("fc1", torch::nn::Linear(s.input.back(), s.hidden));
  fc2 = register_module("fc2", torch::nn::Linear(s.hidden, s.hidden));
  fc3 = register_module("fc3", torch::nn::Linear(s.hidden, s.classes));
}

at::Tensor MlpImpl::forward(at::Tensor x) {
  return fc3(at::relu(fc2(at::relu(fc1(x)))));
}

TransformerNetImpl::TransformerNetImpl(const WorkloadShape& s) {
  namespace nn = torch::nn;
  auto layer = nn::TransformerEncoderLayerOptions(s.d_model, s.heads)
                   .dim_feedforward(s.feedforward)
                   .dropout(0.1);
  encoder = register_module(
      "encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, s.layers)));
  head = register_module("head", nn::Linear(s.d_model, s.classes));
}

at::Tensor TransformerNetImpl::forward(at::Tensor x) {
  return head(encoder(x).mean(0));
}

ShardedEncoderImpl::ShardedEncoderImpl(const WorkloadShape& s) {
  namespace nn = torch::nn;
  auto list = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < s.layers; ++i) {
    FullyShard<nn::TransformerEncoderLayerImpl> layer(
        nn::TransformerEncoderLayerOptions(s.d_model, s.heads)
            .dim_feedforward(s.feedforward)
            .dropout(0.1));
    list->push_back(layer.ptr());
    layers.push_back(layer);
  }
}

at::Tensor ShardedEncoderImpl::forward(at::Tensor x) {
  for (auto& layer : layers) x = layer(x);
  return x;
}

ShardedTransformerNetImpl::ShardedTransformerNetImpl(const WorkloadShape& s) {
  encoder = register_module("encoder", ShardedEncoder(s));
  head = register_module("head", torch::nn::Linear(s.d_model, s.classes));
}

at::Tensor ShardedTransformerNetImpl::forward(at::Tensor x) {
  return head(encoder(x).mean(0));
}

void shard_model(ShardedTransformerNet& net, const FullyShardOptions& options) {
  FullyShardOptions inner = options;
  inner.mp_policy.output_dtype = std::nullopt;  // the root's only: the head reads the layers'
  for (auto& layer : net->encoder->layers) fully_shard(layer, inner);
  fully_shard(net, options);
}

void shard_model(ShardedMlp& net, const FullyShardOptions& options) {
  fully_shard(net, options);
}

std::vector<std::pair<at::Tensor, at::Tensor>> make_batches(const WorkloadShape& s,
                                                            int count, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int i = 0; i < count; ++i) {
    at::Tensor x = at::randn(s.input);
    at::Tensor y = at::randint(s.classes, {s.batch});
    out.emplace_back(x, y);
  }
  return out;
}

}  // namespace ddp::bench
