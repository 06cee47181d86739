// Collectives over N ranks as threads: values for every op, world sizes 1..8,
// tensor sizes of 0, 1, 4, 1000 and 100003 elements; argument errors;
// timeouts. The shared-memory path (src/shm/shm_protocol.cc) reduces up to
// 256 KiB in one shot, reading every rank's whole tensor: 4 and 1000 floats
// are not whole 64-byte lines. Above that it gives each rank a slice of whole
// lines to reduce: 100003 floats (400012 bytes) leave the last slice shorter
// than the others at every world size above 1.
#include "ddp/collectives.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <thread>

#include "ddp/error.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::run_ranks;
using testing::run_ranks_collect;

class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  int64_t numel() const { return std::get<1>(GetParam()); }
};

// [0, 1, ..., 999, 0, 1, ...]: small enough that the product over 8 ranks
// stays far from float's range (about 1e24) and sums are exact.
at::Tensor base_of(int64_t n) { return at::arange(n, at::kFloat).remainder(1000); }

// Rank r's input: base + r + 1, so every op has a distinct known result.
at::Tensor input(int rank, int64_t n) { return base_of(n) + (rank + 1); }

TEST_P(CollectivesTest, AllReduceOps) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    at::Tensor base = base_of(n);
    struct Case { ReduceOp op; at::Tensor expect; };
    // sum_r (i + r + 1) = W*i + W(W+1)/2
    std::vector<Case> cases = {
        {ReduceOp::SUM, base * W + W * (W + 1) / 2.0},
        {ReduceOp::AVG, base + (W + 1) / 2.0},
        {ReduceOp::MIN, base + 1},
        {ReduceOp::MAX, base + W},
    };
    at::Tensor prod = at::ones({n}, at::kFloat);
    for (int k = 0; k < W; ++k) prod = prod * (base + k + 1);
    cases.push_back({ReduceOp::PRODUCT, prod});
    for (auto& c : cases) {
      at::Tensor t = input(r, n);
      all_reduce(t, c.op);
      EXPECT_TRUE(t.allclose(c.expect)) << to_string(c.op) << " rank " << r;
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int W = world();
  run_ranks(W, [&](int r) {
    for (int src = 0; src < W; ++src) {
      at::Tensor t = input(r, numel());
      broadcast(t, src);
      EXPECT_TRUE(t.equal(input(src, numel()))) << "src " << src;
    }
  });
}

TEST_P(CollectivesTest, AllGatherGatherScatterReduce) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    auto all = all_gather(input(r, n));
    ASSERT_EQ(all.size(), static_cast<size_t>(W));
    for (int k = 0; k < W; ++k) EXPECT_TRUE(all[k].equal(input(k, n)));

    int root = W - 1;
    auto g = gather(input(r, n), root);
    ASSERT_EQ(g.size(), r == root ? static_cast<size_t>(W) : 0u);
    for (size_t k = 0; k < g.size(); ++k) EXPECT_TRUE(g[k].equal(input(k, n)));

    std::vector<at::Tensor> pieces;
    if (r == 0) for (int k = 0; k < W; ++k) pieces.push_back(input(10 * k, n));
    at::Tensor out = at::zeros({n}, at::kFloat);
    scatter(out, pieces, 0);
    EXPECT_TRUE(out.equal(input(10 * r, n)));

    at::Tensor red = input(r, n);
    reduce(red, 0, ReduceOp::SUM);
    if (r == 0) {
      EXPECT_TRUE(red.allclose(base_of(n) * W + W * (W + 1) / 2.0));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, CollectivesTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values<int64_t>(0, 1, 4, 1000, 100003)));

TEST(Collectives, AsyncAllReduceAndBarrier) {
  run_ranks(3, [](int r) {
    std::vector<at::Tensor> ts;
    std::vector<Work> works;
    for (int i = 0; i < 4; ++i) {
      ts.push_back(at::full({8}, static_cast<double>(r + i), at::kDouble));
      works.push_back(all_reduce_async(ts.back()));
    }
    for (auto& w : works) w.wait();
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(ts[i].equal(at::full({8}, 3.0 * i + 3, at::kDouble)));
      EXPECT_TRUE(works[i].is_completed());
    }
    works[0].wait();  // a second wait returns at once
    barrier();
  });
}

TEST(Collectives, ObjectHelpers) {
  run_ranks(3, [](int r) {
    auto all = all_gather_string(std::string(r * 3, 'a' + r));
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[0], "");
    EXPECT_EQ(all[1], "bbb");
    EXPECT_EQ(all[2], "cccccc");
    EXPECT_EQ(broadcast_string(r == 2 ? "from two" : "x", 2), "from two");
    struct Counters { int64_t a; double b; };
    auto values = all_gather_value(Counters{r, r * 0.5});
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(values[k].a, k);
      EXPECT_EQ(values[k].b, k * 0.5);
    }
    EXPECT_EQ(broadcast_value<int>(r + 40, 1), 41);
  });
}

TEST(Collectives, BadArgumentsNameTheProblem) {
  run_ranks(2, [](int r) {
    at::Tensor ints = at::ones({3}, at::kInt);
    try {
      all_reduce(ints, ReduceOp::AVG);
      ADD_FAILURE() << "AVG on int accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("needs a floating-point tensor"), std::string::npos);
    }
    at::Tensor t = at::ones({4, 4}).t();
    EXPECT_THROW(all_reduce(t), InvalidArgument);
    at::Tensor x = at::ones({2});
    try {
      broadcast(x, 5);
      ADD_FAILURE();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("src=5 is not a rank of the group (size 2)"),
                std::string::npos);
    }
    std::vector<at::Tensor> wrong(1, at::ones({2}));
    if (r == 0) EXPECT_THROW(scatter(x, wrong, 0), InvalidArgument);
    barrier();  // the ranks stay in step: nothing above reached the backend
  });
}

TEST(Collectives, NoDefaultGroupIsAClearError) {
  at::Tensor t = at::ones({1});
  try {
    all_reduce(t);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("call ddp::init_process_group() first"),
              std::string::npos);
  }
}

TEST(Collectives, RankThatSkipsACollectiveTimesOutOnTheOthers) {
  testing::ThreadWorldOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::ones({16});
    if (r == 0) all_reduce(t);  // rank 1 never joins
  }, o);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(testing::is_a<TimeoutError>(errors[0])) << testing::message_of(errors[0]);
  EXPECT_NE(testing::message_of(errors[0]).find("all_reduce #0 on rank 0 of 2 (gloo) timed out"),
            std::string::npos) << testing::message_of(errors[0]);
  EXPECT_FALSE(errors[1]);
  EXPECT_LT(took, 10.0);
}

TEST(Collectives, PerCallTimeoutIsHonoured) {
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::ones({16});
    CollectiveOptions o;
    o.timeout = std::chrono::milliseconds(300);
    if (r == 1) barrier(o);  // rank 0 never joins
  });
  EXPECT_TRUE(testing::is_a<TimeoutError>(errors[1])) << testing::message_of(errors[1]);
}

}  // namespace
}  // namespace ddp
