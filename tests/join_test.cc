// Join with uneven inputs: every rank ends with the parameters PyTorch's
// rule gives (gradients of the ranks still training, summed, divided by the
// initial world size or by the number still training), throw on early
// termination, and without join the rank with more data times out naming
// the iteration instead of hanging.
#include "ddp/join.h"

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

constexpr double kLr = 0.1;
constexpr int kBatch = 4;

struct Uneven {
  std::vector<int> batches;  // per rank
  std::vector<std::vector<at::Tensor>> x, y;  // [rank][batch]
};

Uneven make_uneven(std::vector<int> batches) {
  torch::manual_seed(99);
  Uneven u;
  u.batches = batches;
  for (int n : batches) {
    u.x.emplace_back();
    u.y.emplace_back();
    for (int i = 0; i < n; ++i) {
      u.x.back().push_back(torch::randn({kBatch, 8}));
      u.y.back().push_back(torch::randn({kBatch, 4}));
    }
  }
  return u;
}

// PyTorch's rule, in one process: at iteration i the ranks with more than i
// batches each compute their gradient at the current parameters; their sum
// divided by W (or by their number) is the step.
NamedState reference(const Mlp& init, const Uneven& u, bool divide_by_initial) {
  Mlp m;
  copy_state(init, m);
  const int W = static_cast<int>(u.batches.size());
  const int iterations = *std::max_element(u.batches.begin(), u.batches.end());
  for (int i = 0; i < iterations; ++i) {
    std::vector<at::Tensor> sum;
    int active = 0;
    for (int r = 0; r < W; ++r) {
      if (u.batches[r] <= i) continue;
      ++active;
      for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
      torch::mse_loss(m(u.x[r][i]), u.y[r][i]).backward();
      auto params = m->parameters();
      if (sum.empty()) {
        for (auto& p : params) sum.push_back(p.grad().clone());
      } else {
        for (size_t k = 0; k < params.size(); ++k) sum[k] += params[k].grad();
      }
    }
    torch::NoGradGuard g;
    auto params = m->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      params[k] -= kLr * sum[k] / (divide_by_initial ? W : active);
    }
  }
  return state_of(m);
}

std::vector<NamedState> train_with_join(const Mlp& init, const Uneven& u, JoinOptions options) {
  const int W = static_cast<int>(u.batches.size());
  std::vector<Mlp> models(W);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(W);
  run_ranks(W, [&](int r) {
    DistributedDataParallel<Mlp> model(models[r]);
    torch::optim::SGD opt(model.parameters(), kLr);
    join(model, [&] {
      for (int i = 0; i < u.batches[r]; ++i) {
        opt.zero_grad();
        torch::mse_loss(model(u.x[r][i]), u.y[r][i]).backward();
        opt.step();
      }
    }, options);
    states[r] = state_of(models[r]);
  });
  return states;
}

class JoinRule : public ::testing::TestWithParam<std::tuple<std::vector<int>, bool>> {};

TEST_P(JoinRule, EveryRankEndsWithPyTorchsRule) {
  auto [batches, divide_by_initial] = GetParam();
  torch::manual_seed(5);
  Mlp init;
  Uneven u = make_uneven(batches);
  JoinOptions o;
  o.divide_by_initial_world_size = divide_by_initial;
  auto states = train_with_join(init, u, o);
  auto expected = reference(init, u, divide_by_initial);
  for (size_t r = 0; r < states.size(); ++r) {
    expect_same_state(states[r], expected, "rank " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Uneven, JoinRule,
    ::testing::Combine(::testing::Values(std::vector<int>{2, 3}, std::vector<int>{1, 3, 2},
                                         std::vector<int>{0, 2}, std::vector<int>{3, 3}),
                       ::testing::Bool()));

TEST(Join, ThrowOnEarlyTerminationStopsEveryRank) {
  Uneven u = make_uneven({1, 3});
  torch::manual_seed(5);
  Mlp init;
  std::vector<Mlp> models(2);
  for (auto& m : models) copy_state(init, m);
  auto errors = run_ranks_collect(2, [&](int r) {
    DistributedDataParallel<Mlp> model(models[r]);
    JoinOptions o;
    o.throw_on_early_termination = true;
    join(model, [&] {
      for (int i = 0; i < u.batches[r]; ++i) torch::mse_loss(model(u.x[r][i]), u.y[r][i]).backward();
    }, o);
  });
  EXPECT_NE(message_of(errors[0]).find("1 of 2 ranks ran out of inputs (this rank is one of them)"),
            std::string::npos) << message_of(errors[0]);
  EXPECT_NE(message_of(errors[1]).find("1 of 2 ranks ran out of inputs (this rank still has inputs)"),
            std::string::npos) << message_of(errors[1]);
}

TEST(Join, WithoutJoinTheRankWithMoreDataTimesOutNamingTheIteration) {
  Uneven u = make_uneven({2, 3});
  ThreadWorldOptions w;
  w.timeout = std::chrono::milliseconds(1500);
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks_collect(2, [&](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    for (int i = 0; i < u.batches[r]; ++i) torch::mse_loss(model(u.x[r][i]), u.y[r][i]).backward();
  }, w);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(errors[0]);
  ASSERT_TRUE(is_a<TimeoutError>(errors[1])) << message_of(errors[1]);
  EXPECT_NE(message_of(errors[1]).find("(iteration 2)"), std::string::npos) << message_of(errors[1]);
  EXPECT_LT(took, 20.0);
}

}  // namespace
}  // namespace ddp::testing
