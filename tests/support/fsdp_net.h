// Test support: the model of the fully_shard tests and of the comparison
// with PyTorch's fully_shard (tests/oracle/fsdp_oracle.py has its Python
// twin: same parameter names and shapes), its data and its sharding.
#pragma once

#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <string>
#include <utility>

#include "ddp/fully_shard.h"

namespace ddp::testing::fsdp_net {

namespace nn = torch::nn;

// Uneven dim-0 sizes on purpose: 7, 5 and 3 rows leave ranks with short or
// empty chunks at W = 2..4.
struct BlockImpl : nn::Module {
  BlockImpl(int64_t width, int64_t hidden)
      : fc1(register_module("fc1", nn::Linear(width, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, width))) {}
  at::Tensor forward(at::Tensor x) { return x + fc2(torch::tanh(fc1(x))); }
  nn::Linear fc1, fc2;
};
using Block = FullyShard<BlockImpl>;

struct NetImpl : nn::Module {
  NetImpl()
      : inp(register_module("inp", nn::Linear(6, 5))),
        b1(register_module("b1", Block(5, 7))),
        b2(register_module("b2", Block(5, 3))),
        head(register_module("head", nn::Linear(5, 3))) {}
  at::Tensor forward(at::Tensor x) { return head(b2(b1(torch::relu(inp(x))))); }
  nn::Linear inp;
  Block b1, b2;
  nn::Linear head;
};
using Net = FullyShard<NetImpl>;

constexpr int64_t kGlobalBatch = 12;  // divides evenly over 1..4 ranks

inline std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(900 + step);
  at::Tensor x = torch::randn({kGlobalBatch, 6}, gen);
  at::Tensor y = torch::randn({kGlobalBatch, 3}, gen);
  const int64_t n = kGlobalBatch / world;
  return {x.narrow(0, rank * n, n), y.narrow(0, rank * n, n)};
}

// One reference model's values, copied into every model built from it
// (made once: ranks are threads, and the global generator is shared).
inline const std::map<std::string, at::Tensor>& initial_values() {
  static const std::map<std::string, at::Tensor> values = [] {
    torch::manual_seed(5);
    Net net;
    std::map<std::string, at::Tensor> v;
    for (const auto& p : net->named_parameters()) v[p.key()] = p.value().detach().clone();
    return v;
  }();
  return values;
}

inline Net model_like(const std::map<std::string, at::Tensor>& values) {
  Net net;
  torch::NoGradGuard no_grad;
  for (auto& p : net->named_parameters()) p.value().copy_(values.at(p.key()));
  return net;
}

inline void shard(Net& net, bool reshard_after_forward = true,
                  const MixedPrecisionPolicy& mp = {}) {
  FullyShardOptions o;
  o.reshard_after_forward = reshard_after_forward;
  o.mp_policy = mp;
  o.mp_policy.output_dtype = std::nullopt;  // the root's only (the head's input)
  fully_shard(net->b1, o);
  fully_shard(net->b2, o);
  o.mp_policy.output_dtype = mp.output_dtype;
  fully_shard(net, o);
}

// Optimizer steps [from, to) on the global batches, as rank `rank` of
// `world` (world 1 with an unsharded net: one process on the whole batch).
inline void train_steps(Net& net, torch::optim::Optimizer& opt, int from, int to, int rank,
                        int world) {
  for (int step = from; step < to; ++step) {
    opt.zero_grad();
    auto [x, y] = batch(step * 10, rank, world);
    torch::mse_loss(net(x), y).backward();
    opt.step();
  }
}

}  // namespace ddp::testing::fsdp_net
