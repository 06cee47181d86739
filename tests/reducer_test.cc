// The internal Reducer driven directly (no DistributedDataParallel module),
// ranks as threads: Note [Reducer protocol] in src/reducer/reducer.h. Each rank
// builds loss = sum_i (p_i * c_{r,i}).sum(), so d loss / d p_i = c_{r,i}
// exactly, and the test checks .grad() against the hand-computed average.
//
// Exactness: the reducer pre-multiplies each gradient by fl(1/W) before the
// all_reduce. Every constant here is W times a small dyadic number k, for
// which fl(W*k * fl(1/W)) == k exactly (W = 1, 2, 3), so the reduced sum is
// exact in any summation order and torch::equal against the double-computed
// average is a fair check.
#include "reducer/reducer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "group_bucket_comm.h"
#include "support/thread_world.h"

namespace ddp::detail {
namespace {

const std::vector<std::vector<int64_t>> kShapes = {{3}, {2, 2}, {5}, {1}, {2, 3}};

// Rank r's gradient of parameter i in iteration `it`: W * k (see above).
at::Tensor grad_of(int world, int rank, int i, int it, at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor k = torch::arange(n, torch::kDouble) * -3.0 + (rank + 1) * (i + 2) + 10 * it +
                 (rank == 1 ? 0.5 : 0.0);
  return (k * world).to(torch::kFloat).view(shape);
}

// The average over ranks of the given gradients (double, then float: exact).
at::Tensor average(const std::vector<at::Tensor>& per_rank, int world) {
  at::Tensor sum = torch::zeros_like(per_rank.at(0), torch::kDouble);
  for (const auto& g : per_rank) sum += g.to(torch::kDouble);
  return (sum / world).to(torch::kFloat);
}

struct World {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
};

World make_params(const std::vector<std::vector<int64_t>>& shapes) {
  World w;
  for (size_t i = 0; i < shapes.size(); ++i) {
    w.names.push_back("p" + std::to_string(i));
    w.params.push_back(torch::full(shapes[i], 1.0 + i, torch::kFloat).requires_grad_(true));
  }
  return w;
}

// One synchronised iteration as DdpCore drives it: prepare_for_forward at
// the forward's start, prepare_for_backward with the outputs at its end,
// then backward() (the reducer's own hooks and queued finalize do the rest).
void iteration(Reducer& reducer, const std::vector<at::Tensor>& params, int world, int rank,
               int it, const std::function<bool(size_t)>& used) {
  reducer.prepare_for_forward();
  at::Tensor loss = torch::zeros({}, torch::kFloat);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!used(i)) continue;
    loss = loss + (params[i] * grad_of(world, rank, static_cast<int>(i), it, params[i].sizes()))
                      .sum();
  }
  reducer.prepare_for_backward({loss}, /*outputs_known=*/true);
  loss.backward();
}

// The communication DdpCore gives the reducer: one all_reduce per bucket.
std::unique_ptr<BucketComm> fused() { return make_fused_all_reduce({default_group(), {}}); }

ReducerOptions options(bool tiny_buckets, bool find_unused) {
  ReducerOptions o;
  if (tiny_buckets) {  // 12 bytes first, then 16: several buckets
    o.first_bucket_cap_bytes = 12;
    o.bucket_cap_bytes = 16;
  }
  o.find_unused_parameters = find_unused;
  o.timeout = std::chrono::milliseconds(30000);
  return o;
}

class ReducerWorlds : public ::testing::TestWithParam<int> {};

// Every rank uses every parameter: after each backward every .grad() is the
// exact average of the ranks' gradients, whatever the bucket layout (one
// bucket, or tiny buckets), across the rebuild after the first iteration.
TEST_P(ReducerWorlds, AllUsedGradIsExactAverageForAnyBuckets) {
  const int world = GetParam();
  constexpr int kIters = 2;
  for (bool tiny : {false, true}) {
    SCOPED_TRACE(tiny ? "tiny buckets" : "one bucket");
    std::vector<std::vector<std::vector<at::Tensor>>> grads(world);  // [rank][it][param]
    std::vector<Reducer::Stats> stats(world);
    testing::run_ranks(world, [&](int rank) {
      World w = make_params(kShapes);
      auto reducer =
          Reducer::create(w.names, w.params, default_group(), fused(), options(tiny, false));
      for (int it = 0; it < kIters; ++it) {
        for (auto& p : w.params) p.mutable_grad() = at::Tensor();  // zero_grad(set_to_none)
        iteration(*reducer, w.params, world, rank, it, [](size_t) { return true; });
        std::vector<at::Tensor> g;
        for (auto& p : w.params) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
        grads[rank].push_back(g);
      }
      stats[rank] = reducer->stats();
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(stats[r].iterations, kIters);
      EXPECT_EQ(stats[r].parameters, static_cast<int64_t>(kShapes.size()));
      EXPECT_EQ(stats[r].unused_parameters_last, 0);
      if (tiny) {
        EXPECT_GE(stats[r].bucket_params.size(), 3u) << "rank " << r;
      } else {
        EXPECT_EQ(stats[r].bucket_params.size(), 1u) << "rank " << r;
      }
      for (int it = 0; it < kIters; ++it) {
        for (size_t i = 0; i < kShapes.size(); ++i) {
          std::vector<at::Tensor> per_rank;
          for (int q = 0; q < world; ++q) {
            per_rank.push_back(grad_of(world, q, static_cast<int>(i), it, kShapes[i]));
          }
          const at::Tensor expected = average(per_rank, world);
          const at::Tensor& got = grads[r][it][i];
          ASSERT_TRUE(got.defined()) << "rank " << r << " it " << it << " p" << i;
          EXPECT_TRUE(torch::equal(got, expected))
              << "rank " << r << " it " << it << " p" << i << "\ngot " << got << "\nexpected "
              << expected;
        }
      }
    }
  }
}

// find_unused_parameters, tiny buckets:
//   p0..p2, p4  used by every rank: the average;
//   p3          used by rank 0 only (.grad() undefined elsewhere): the other
//               ranks contribute zeros, so c_0 / W;
//   p5          used by rank 0 only; the others' .grad() is preset: they
//               contribute it, (c_0 + sum_{r>0} preset_r) / W;
//   p6          used by no rank, .grad() undefined: stays undefined;
//   p7          used by no rank, .grad() preset per rank: left untouched
//               (not averaged), as in PyTorch.
TEST_P(ReducerWorlds, FindUnusedParameters) {
  const int world = GetParam();
  auto shapes = kShapes;
  shapes.push_back({4});  // p5
  shapes.push_back({2});  // p6
  shapes.push_back({3});  // p7
  auto preset = [&](int rank, size_t i) {  // W * small integer: exact
    return torch::full(shapes[i], static_cast<double>(world * (20 + rank + i)), torch::kFloat);
  };
  constexpr int kIters = 2;
  std::vector<std::vector<std::vector<at::Tensor>>> grads(world);
  std::vector<Reducer::Stats> stats(world);
  std::vector<std::vector<int64_t>> p7_ptr(world);
  testing::run_ranks(world, [&](int rank) {
    World w = make_params(shapes);
    auto reducer = Reducer::create(w.names, w.params, default_group(), fused(), options(true, true));
    auto used = [rank](size_t i) {
      if (i == 3 || i == 5) return rank == 0;
      return i != 6 && i != 7;
    };
    for (int it = 0; it < kIters; ++it) {
      for (auto& p : w.params) p.mutable_grad() = at::Tensor();
      if (rank > 0) w.params[5].mutable_grad() = preset(rank, 5);
      w.params[7].mutable_grad() = preset(rank, 7);
      const void* p7_before = w.params[7].grad().data_ptr();
      iteration(*reducer, w.params, world, rank, it, used);
      p7_ptr[rank].push_back(w.params[7].grad().data_ptr() == p7_before ? 1 : 0);
      std::vector<at::Tensor> g;
      for (auto& p : w.params) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      grads[rank].push_back(g);
    }
    stats[rank] = reducer->stats();
  });
  for (int r = 0; r < world; ++r) {
    // Not used by every rank: p5..p7, and p3 and p5 when W > 1.
    EXPECT_EQ(stats[r].unused_parameters_last, world > 1 ? 4 : 2) << "rank " << r;
    EXPECT_GE(stats[r].bucket_params.size(), 3u) << "rank " << r;
    for (int it = 0; it < kIters; ++it) {
      const auto& g = grads[r][it];
      const std::string where = "rank " + std::to_string(r) + " it " + std::to_string(it);
      for (size_t i : {0, 1, 2, 4}) {
        std::vector<at::Tensor> per_rank;
        for (int q = 0; q < world; ++q) {
          per_rank.push_back(grad_of(world, q, static_cast<int>(i), it, shapes[i]));
        }
        ASSERT_TRUE(g[i].defined()) << where << " p" << i;
        EXPECT_TRUE(torch::equal(g[i], average(per_rank, world))) << where << " p" << i;
      }
      {  // p3: rank 0's gradient, zeros from the others
        std::vector<at::Tensor> per_rank{grad_of(world, 0, 3, it, shapes[3])};
        for (int q = 1; q < world; ++q) per_rank.push_back(torch::zeros(shapes[3]));
        ASSERT_TRUE(g[3].defined()) << where;
        EXPECT_TRUE(torch::equal(g[3], average(per_rank, world)))
            << where << " p3 got " << g[3];
      }
      {  // p5: rank 0's gradient, the others' preset .grad()
        std::vector<at::Tensor> per_rank{grad_of(world, 0, 5, it, shapes[5])};
        for (int q = 1; q < world; ++q) per_rank.push_back(preset(q, 5));
        ASSERT_TRUE(g[5].defined()) << where;
        EXPECT_TRUE(torch::equal(g[5], average(per_rank, world)))
            << where << " p5 got " << g[5];
      }
      EXPECT_FALSE(g[6].defined()) << where << " p6 got a gradient";
      ASSERT_TRUE(g[7].defined()) << where;
      EXPECT_TRUE(torch::equal(g[7], preset(r, 7))) << where << " p7 got " << g[7];
      EXPECT_EQ(p7_ptr[r][it], 1) << where << " p7's .grad() tensor was replaced";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ReducerWorlds, ::testing::Values(1, 2, 3));

// Without find_unused_parameters a parameter some rank did not use is an
// error that every rank reports identically (from the flags in the bucket,
// no extra collective), after the buckets were reduced (no rank hangs).
TEST(Reducer, PartlyUnusedWithoutFindUnusedRaisesOnEveryRank) {
  constexpr int kWorld = 2;
  auto errors = testing::run_ranks_collect(kWorld, [&](int rank) {
    World w = make_params(kShapes);
    auto reducer = Reducer::create(w.names, w.params, default_group(), fused(), options(true, false));
    iteration(*reducer, w.params, kWorld, rank, 0,
              [rank](size_t i) { return !(i == 3 && rank == 1); });
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(testing::is_a<InvalidArgument>(errors[r]))
        << "rank " << r << ": " << testing::message_of(errors[r]);
    const std::string msg = testing::message_of(errors[r]);
    EXPECT_NE(msg.find("p3 (" + std::string(r == 0 ? "used" : "unused") +
                       " on this rank; used on 1 of 2 ranks)"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("p0"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ddp::detail
