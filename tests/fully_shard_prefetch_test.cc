// fully_shard's prefetching (Note [Prefetching] in src/fsdp/fsdp_unit.h):
// from the second iteration on, each unit's all-gather is issued by the
// unit before it, in forward and in backward, and used; training equals one
// process with prefetching on and off; a gather issued for a unit that did
// not run this iteration is dropped, so the next time that unit runs, after
// an optimizer step, it gathers the stepped shards, not stale ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "ddp/fully_shard.h"
#include "fsdp/fsdp_unit.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace nn = torch::nn;

struct LayerImpl : nn::Module {
  LayerImpl() : fc(register_module("fc", nn::Linear(5, 5))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(fc(x)); }
  nn::Linear fc;
};
using Layer = FullyShard<LayerImpl>;

// Three units; the middle one runs only when asked.
struct ChainImpl : nn::Module {
  ChainImpl()
      : a(register_module("a", Layer())),
        b(register_module("b", Layer())),
        c(register_module("c", Layer())),
        head(register_module("head", nn::Linear(5, 2))) {}
  at::Tensor forward(const at::Tensor& x, bool with_b) {
    at::Tensor h = a(x);
    if (with_b) h = b(h);
    return head(c(h));
  }
  Layer a, b, c;
  nn::Linear head;
};
using Chain = FullyShard<ChainImpl>;

constexpr int kSteps = 5;
bool runs_b(int step) { return step != 2; }  // skipped once, after it was recorded

std::pair<at::Tensor, at::Tensor> data(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(70 + step);
  at::Tensor x = torch::randn({12, 5}, gen), y = torch::randn({12, 2}, gen);
  const int64_t n = 12 / world;
  return {x.narrow(0, rank * n, n), y.narrow(0, rank * n, n)};
}

const std::map<std::string, at::Tensor>& initial() {
  static const std::map<std::string, at::Tensor> v = [] {
    torch::manual_seed(3);
    Chain c;
    std::map<std::string, at::Tensor> out;
    for (const auto& p : c->named_parameters()) out[p.key()] = p.value().detach().clone();
    return out;
  }();
  return v;
}

Chain chain() {
  Chain c;
  torch::NoGradGuard no_grad;
  for (auto& p : c->named_parameters()) p.value().copy_(initial().at(p.key()));
  return c;
}

std::map<std::string, at::Tensor> train(Chain& net, int rank, int world) {
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.2).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = data(step, rank, world);
    opt.zero_grad();
    torch::mse_loss(net(x, runs_b(step)), y).backward();
    // A skipped unit still moves (momentum), so a gather of it from before
    // the step would be stale after it.
    for (auto& p : net->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  if (world == 1 && !net->is_sharded()) {
    for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  } else {
    for (const auto& kv : full_state_dict(*net)) out[kv.key()] = kv.value();
  }
  return out;
}

struct Counts {
  int64_t used = 0, dropped = 0;
};
Counts counts(Layer& unit) {
  auto* s = unit->fsdp_state();
  return {s->prefetches_used(), s->prefetches_dropped()};
}

TEST(FullyShardPrefetch, GathersAheadAndEqualsOneProcessEvenWhenAUnitIsSkipped) {
  Chain single = chain();
  const auto want = train(single, 0, 1);
  for (bool prefetch : {true, false}) {
    run_ranks(3, [&](int rank) {
      Chain net = chain();
      FullyShardOptions o;
      o.prefetch = prefetch;
      for (Layer* u : {&net->a, &net->b, &net->c}) fully_shard(*u, o);
      fully_shard(net, o);
      const auto got = train(net, rank, 3);
      for (const auto& [name, w] : want) {
        EXPECT_TRUE(torch::allclose(got.at(name), w, 1e-5, 1e-6))
            << (prefetch ? "prefetch" : "no prefetch") << " " << name << " differs by "
            << (got.at(name) - w).abs().max().item<double>();
      }
      const Counts a = counts(net->a), b = counts(net->b), c = counts(net->c);
      if (!prefetch) {
        EXPECT_EQ(a.used + b.used + c.used + a.dropped + b.dropped + c.dropped, 0);
        return;
      }
      // The order is recorded when the root's forward ends, so forwards
      // prefetch from step 1 on and backwards from step 0. Forward: the root
      // prefetches a, a prefetches b, b prefetches c, each in the last
      // forward's order: at step 2 a prefetches b, which does not run
      // (dropped), and c gathers itself; at step 3 a prefetches c (step 2's
      // order) and b gathers itself. Backward, in the reverse of the order
      // forwards ended: the root prefetches c, c b, b a (at step 2, c a).
      EXPECT_EQ(a.used, 4 + 5) << "forward, backward";
      EXPECT_EQ(b.used, 2 + 4);  // forward at steps 1 and 4; backward at 0, 1, 3, 4
      EXPECT_EQ(b.dropped, 1);
      EXPECT_EQ(c.used, 3 + 5);
      EXPECT_EQ(a.dropped + c.dropped, 0);
    });
  }
}

}  // namespace
}  // namespace ddp::testing
