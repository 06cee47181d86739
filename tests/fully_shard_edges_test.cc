// fully_shard's edges, from a new user's trial: a parameter used on one
// rank only behind a frozen input layer (its collectives once crossed over
// TCP), requires_grad flipped after sharding, a tensor computed from a
// unit's parameters kept aside instead of returned (an error, never the
// shard read silently), a full state dict loaded while the root is
// gathered, and strict state-dict loading.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <functional>
#include <map>
#include <string>

#include "ddp/fully_shard.h"
#include "support/expect_error.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace nn = torch::nn;
using Values = std::map<std::string, at::Tensor>;

struct EdgeBlockImpl : nn::Module {
  EdgeBlockImpl()
      : fc(register_module("fc", nn::Linear(6, 6))),
        extra(register_parameter("extra", torch::randn({6}) * 0.1)),
        gain(register_parameter("gain", torch::ones({}))) {}
  at::Tensor forward(at::Tensor x) {
    at::Tensor out = x + gain * torch::tanh(fc(x));
    if (use_extra) out = out + extra * x;
    if (keep_aside) aside = gain.pow(2);  // 0-dim: its shard is [1] or [0]
    return out;
  }
  nn::Linear fc;
  at::Tensor extra, gain;
  bool use_extra = true;
  bool keep_aside = false;
  at::Tensor aside;
};
using EdgeBlock = FullyShard<EdgeBlockImpl>;

struct EdgeNetImpl : nn::Module {
  EdgeNetImpl()
      : inp(register_module("inp", nn::Linear(4, 6))),
        b0(register_module("b0", EdgeBlock())),
        b1(register_module("b1", EdgeBlock())),
        head(register_module("head", nn::Linear(6, 2))) {}
  at::Tensor forward(at::Tensor x) { return head(b1(b0(inp(x)))); }
  nn::Linear inp;
  EdgeBlock b0, b1;
  nn::Linear head;
};
using EdgeNet = FullyShard<EdgeNetImpl>;

const Values& initial() {
  static const Values values = [] {
    torch::manual_seed(11);
    EdgeNet net;
    Values v;
    for (const auto& p : net->named_parameters()) v[p.key()] = p.value().detach().clone();
    return v;
  }();
  return values;
}

EdgeNet net_like(const Values& v) {
  EdgeNet net;
  torch::NoGradGuard no_grad;
  for (auto& p : net->named_parameters()) p.value().copy_(v.at(p.key()));
  return net;
}

void shard(EdgeNet& net) {
  fully_shard(net->b0);
  fully_shard(net->b1);
  fully_shard(net);
}

std::pair<at::Tensor, at::Tensor> data(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(40 + step);
  at::Tensor x = torch::randn({12, 4}, gen);
  at::Tensor y = torch::randn({12, 2}, gen);
  const int64_t n = 12 / world;
  return {x.narrow(0, rank * n, n), y.narrow(0, rank * n, n)};
}

// Per step: configure(net, rank, step) before each rank's forward. The
// reference sums every rank's loss (each configured for that rank) / W in
// one process: the gradient fully_shard averages.
using Configure = std::function<void(EdgeNet&, int rank, int step)>;

Values reference(int world, int steps, const Configure& configure) {
  EdgeNet net = net_like(initial());
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    for (int r = 0; r < world; ++r) {
      configure(net, r, step);
      auto [x, y] = data(step, r, world);
      (torch::mse_loss(net(x), y) / world).backward();
    }
    opt.step();
  }
  Values out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

Values sharded(int rank, int world, int steps, const Configure& configure) {
  EdgeNet net = net_like(initial());
  configure(net, rank, -1);
  shard(net);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    configure(net, rank, step);
    auto [x, y] = data(step, rank, world);
    torch::mse_loss(net(x), y).backward();
    opt.step();
  }
  Values out;
  for (const auto& kv : full_state_dict(*net)) out[kv.key()] = kv.value();
  return out;
}

void expect_equal(const Values& got, const Values& want, const std::string& where) {
  for (const auto& [name, w] : want) {
    EXPECT_TRUE(torch::allclose(got.at(name), w, 1e-5, 1e-6))
        << where << ": " << name << " differs by "
        << (got.at(name) - w).abs().max().item<double>();
  }
}

TEST(FullyShardEdges, AParameterUsedOnOneRankBehindAFrozenInputLayer) {
  // The frozen input layer leaves the root nothing to hold back; over TCP
  // (no shared memory) the ranks' collectives once crossed and hung here.
  Configure configure = [](EdgeNet& net, int rank, int) {
    for (auto& p : net->inp->parameters()) p.set_requires_grad(false);
    net->b1->use_extra = rank == 0;
  };
  for (int world : {2, 3}) {
    const Values want = reference(world, 3, configure);
    ThreadWorldOptions tcp;
    tcp.shared_memory = false;
    tcp.timeout = std::chrono::seconds(20);
    run_ranks(
        world,
        [&](int rank) {
          expect_equal(sharded(rank, world, 3, configure), want, "W=" + std::to_string(world));
        },
        tcp);
  }
}

TEST(FullyShardEdges, RequiresGradFlippedAfterShardingIsFollowed) {
  Configure configure = [](EdgeNet& net, int, int step) {
    for (auto& p : net->b1->fc->parameters()) p.set_requires_grad(step > 0);  // frozen first
    for (auto& p : net->b0->parameters()) p.set_requires_grad(step != 1);     // and back
  };
  const Values want = reference(2, 3, configure);
  EXPECT_FALSE(torch::equal(want.at("b1.fc.weight"), initial().at("b1.fc.weight")));
  run_ranks(2, [&](int rank) { expect_equal(sharded(rank, 2, 3, configure), want, "W=2"); });
}

TEST(FullyShardEdges, ATensorKeptAsideFromAUnitFailsInsteadOfReadingTheShard) {
  run_ranks(2, [&](int rank) {
    EdgeNet net = net_like(initial());
    shard(net);
    net->b1->keep_aside = true;
    auto [x, y] = data(0, rank, 2);
    at::Tensor out = net(x);
    // b1.gain was resharded after b1's forward; the loss reads it through
    // `aside`, which no hook of b1 sees (once: a gradient summed from the
    // shard, silently wrong).
    EXPECT_THROW((torch::mse_loss(out, y) + net->b1->aside).backward(), c10::Error);
  });
}

TEST(FullyShardEdges, LoadingAFullStateDictWhileTheRootIsGatheredTakesEffect) {
  run_ranks(2, [&](int rank) {
    EdgeNet net = net_like(initial());
    shard(net);
    auto [x, y] = data(0, rank, 2);
    at::Tensor ignored = net(x);  // grad mode, no backward: the root stays gathered
    torch::OrderedDict<std::string, at::Tensor> zeros;
    for (const auto& [name, v] : initial()) zeros.insert(name, torch::zeros_like(v));
    load_full_state_dict(*net, zeros);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(net(x), torch::zeros({6, 2})));  // head: zero weight and bias
  });
}

TEST(FullyShardEdges, LoadingIsStrictAndAllOrNothing) {
  run_ranks(2, [&](int) {
    EdgeNet net = net_like(initial());
    shard(net);
    torch::OrderedDict<std::string, at::Tensor> state;
    for (const auto& [name, v] : initial()) state.insert(name, torch::zeros_like(v));
    state.insert("stray", torch::zeros({1}));
    expect_error([&] { load_full_state_dict(*net, state); },
                 "the state dict has 'stray', which the model does not");
    torch::OrderedDict<std::string, at::Tensor> short_head;
    for (const auto& [name, v] : initial()) {
      short_head.insert(name, name == "head.weight" ? torch::zeros({1, 6}) : torch::zeros_like(v));
    }
    expect_error([&] { load_full_state_dict(*net, short_head); },
                 "'head.weight' is [1, 6] in the state dict but the model's is [2, 6]");
    Values now;
    for (const auto& kv : full_state_dict(*net)) now[kv.key()] = kv.value();
    expect_equal(now, initial(), "after the refused loads");  // nothing was written
  });
}

}  // namespace
}  // namespace ddp::testing
