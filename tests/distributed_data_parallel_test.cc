// DistributedDataParallel against single-process training: W ranks with
// batch B (threads) must end with the parameters of one process that trains
// on the concatenated W*B batch, within 1e-6, after 5 SGD steps.
#include "ddp/distributed_data_parallel.h"

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::BnCnn;
using testing::Branchy;
using testing::Mlp;
using testing::Tied;
using testing::copy_state;
using testing::expect_same_state;
using testing::state_of;

constexpr int kSteps = 5;
constexpr int kBatch = 4;  // per rank
constexpr double kLr = 0.1;

struct Data {
  std::vector<at::Tensor> x, y;  // per step: [W*B, 8] and [W*B, 4]
  at::Tensor x_of(int step, int rank) const { return x[step].narrow(0, rank * kBatch, kBatch); }
  at::Tensor y_of(int step, int rank) const { return y[step].narrow(0, rank * kBatch, kBatch); }
};

Data make_data(int world, int steps = kSteps, int64_t in = 8) {
  torch::manual_seed(1234);
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.x.push_back(torch::randn({world * kBatch, in}));
    d.y.push_back(torch::randn({world * kBatch, 4}));
  }
  return d;
}

// One process, batch W*B: per-rank chunks go through forward separately (so
// per-chunk behaviour such as BatchNorm statistics or a branch used by one
// rank matches DDP), the loss is the mean over all W*B samples. Buffers end
// as rank 0's chunk left them, as DDP's buffer broadcast does.
template <typename Net, typename Fwd>
std::vector<std::pair<std::string, at::Tensor>> train_reference(Net model, const Data& d,
                                                                int world, Fwd fwd) {
  // Each tensor once (a tied weight too), as Python's parameters().
  torch::optim::SGD opt(detail::unique_parameters(*model.ptr(), true), kLr);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    std::vector<at::Tensor> outs;
    std::vector<at::Tensor> rank0_buffers;
    for (int r = 0; r < world; ++r) {
      outs.push_back(fwd(model, d.x_of(s, r), r));
      if (r == 0) {
        for (const auto& b : model->buffers()) rank0_buffers.push_back(b.detach().clone());
      }
    }
    torch::mse_loss(torch::cat(outs), d.y[s]).backward();
    {
      torch::NoGradGuard g;
      auto bufs = model->buffers();
      for (size_t i = 0; i < bufs.size(); ++i) bufs[i].copy_(rank0_buffers[i]);
    }
    opt.step();
  }
  return state_of(model);
}

// W ranks as threads, each with batch B. Ranks > 0 start from perturbed
// weights: the construction's broadcast must make them rank 0's.
template <typename Net, typename Fwd>
std::vector<std::vector<std::pair<std::string, at::Tensor>>> train_ddp(
    const Net& init, const Data& d, int world, Fwd fwd,
    DistributedDataParallelOptions options = {}, int accumulate = 1) {
  std::vector<Net> models;
  for (int r = 0; r < world; ++r) {
    models.emplace_back();
    copy_state(init, models.back(), r == 0 ? 0.0 : 0.5);
  }
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> states(world);
  testing::run_ranks(world, [&](int r) {
    DistributedDataParallel<Net> model(models[r], options);
    torch::optim::SGD opt(model.parameters(), kLr);
    for (int s = 0; s < kSteps; s += accumulate) {
      opt.zero_grad();
      for (int k = 0; k < accumulate; ++k) {
        auto loss = torch::mse_loss(fwd(model, d.x_of(s + k, r), r), d.y_of(s + k, r)) / accumulate;
        if (k + 1 < accumulate) {
          auto guard = model.no_sync();
          loss.backward();
        } else {
          loss.backward();
        }
      }
      opt.step();
    }
    states[r] = state_of(models[r]);
  });
  return states;
}

template <typename Net, typename Fwd>
void check_equivalence(int world, Fwd fwd, DistributedDataParallelOptions options = {}) {
  torch::manual_seed(7);
  Net init;
  Data d = make_data(world);
  auto states = train_ddp(init, d, world, fwd, options);
  Net ref;
  copy_state(init, ref, 0.0);
  auto expected = train_reference(ref, d, world, fwd);
  for (int r = 0; r < world; ++r) {
    expect_same_state(states[r], expected, "rank " + std::to_string(r));
  }
}

auto plain = [](auto& m, const at::Tensor& x, int) { return m(x); };

class DdpWorlds : public ::testing::TestWithParam<int> {};

TEST_P(DdpWorlds, MlpMatchesSingleProcess) { check_equivalence<Mlp>(GetParam(), plain); }

TEST_P(DdpWorlds, MlpWithGradientAsBucketViewAndTinyBuckets) {
  DistributedDataParallelOptions o;
  o.gradient_as_bucket_view = true;
  o.bucket_cap_mb = 0.0005;  // ~500 bytes: many buckets
  o.first_bucket_cap_mb = 0.0001;
  check_equivalence<Mlp>(GetParam(), plain, o);
}

TEST_P(DdpWorlds, BatchNormCnnBroadcastsBuffers) {
  torch::manual_seed(3);
  auto fwd = [](auto& m, const at::Tensor& x, int) { return m(x.narrow(1, 0, 36)); };
  torch::manual_seed(7);
  BnCnn init;
  Data d = make_data(GetParam(), kSteps, 36);
  auto states = train_ddp(init, d, GetParam(), fwd);
  BnCnn ref;
  copy_state(init, ref, 0.0);
  auto expected = train_reference(ref, d, GetParam(), fwd);
  for (int r = 0; r < GetParam(); ++r) {
    auto state = states[r];
    // Buffers: DDP's rank r ran its own last forward after the broadcast;
    // only rank 0's must equal the reference's.
    if (r > 0) {
      for (auto& kv : state) {
        if (kv.first.rfind("bn.running", 0) == 0 || kv.first == "bn.num_batches_tracked") {
          kv.second = states[0][&kv - &state[0]].second;
        }
      }
    }
    expect_same_state(state, expected, "rank " + std::to_string(r));
  }
}

TEST_P(DdpWorlds, TiedWeightsCountOnce) { check_equivalence<Tied>(GetParam(), plain); }

TEST_P(DdpWorlds, FrozenLayerIsBroadcastNotReduced) {
  torch::manual_seed(7);
  Mlp init;
  init->fc1->weight.set_requires_grad(false);
  init->fc1->bias.set_requires_grad(false);
  Data d = make_data(GetParam());
  auto states = train_ddp(init, d, GetParam(), plain);
  Mlp ref;
  copy_state(init, ref, 0.0);
  auto expected = train_reference(ref, d, GetParam(), plain);
  for (int r = 0; r < GetParam(); ++r) expect_same_state(states[r], expected, "rank " + std::to_string(r));
}

TEST_P(DdpWorlds, UnusedOnAllRanksWithFindUnused) {
  DistributedDataParallelOptions o;
  o.find_unused_parameters = true;
  check_equivalence<Branchy>(GetParam(), [](auto& m, const at::Tensor& x, int) { return m(x, false); }, o);
}

TEST_P(DdpWorlds, UsedOnLastRankOnlyWithFindUnused) {
  DistributedDataParallelOptions o;
  o.find_unused_parameters = true;
  const int last = GetParam() - 1;
  check_equivalence<Branchy>(GetParam(), [last](auto& m, const at::Tensor& x, int r) {
    return m(x, r == last);
  }, o);
}

TEST_P(DdpWorlds, NoSyncAccumulationEqualsLargerBatch) {
  const int W = GetParam();
  const int K = 5;  // all steps of the data accumulated into one update
  torch::manual_seed(7);
  Mlp init;
  Data d = make_data(W);
  auto states = train_ddp(init, d, W, plain, {}, K);
  // Reference: one step on all K*W*B samples.
  Mlp ref;
  copy_state(init, ref, 0.0);
  torch::optim::SGD opt(ref->parameters(), kLr);
  torch::mse_loss(ref(torch::cat(d.x)), torch::cat(d.y)).backward();
  opt.step();
  for (int r = 0; r < W; ++r) expect_same_state(states[r], state_of(ref), "rank " + std::to_string(r));
}

// World sizes 1..8: odd ones (1/W not a power of two) and more ranks than cores.
INSTANTIATE_TEST_SUITE_P(W, DdpWorlds, ::testing::Range(1, 9));

}  // namespace
}  // namespace ddp
