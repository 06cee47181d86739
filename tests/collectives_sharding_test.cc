// The collectives of sharding (collectives_sharding.h) over N ranks as
// threads: values for world sizes 1..8 and the element counts of
// collectives_test.cc (0, 1, 4, 1000, 100003; on the shared-memory path
// 100003 floats leave the last rank's slice shorter); uneven all-to-all
// pieces from every rank to every peer; argument errors, and mismatched
// sizes named on every rank. Runs twice (`@gloo`: DDP_SHM=0).
#include "ddp/collectives_sharding.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "ddp/error.h"
#include "support/expect_error.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::expect_error;
using testing::message_of;
using testing::run_ranks;
using testing::run_ranks_collect;

class ShardingTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  int64_t numel() const { return std::get<1>(GetParam()); }
};

// [0, 1, ..., 999, 0, ...] + rank + 1: sums over 8 ranks stay exact.
at::Tensor input_of(int rank, int64_t n) {
  return at::arange(n, at::kFloat).remainder(1000) + (rank + 1);
}

TEST_P(ShardingTest, ReduceScatterTensorGivesEachRankItsReducedChunk) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    const at::Tensor in = input_of(r, W * n);
    const at::Tensor base = at::arange(W * n, at::kFloat).remainder(1000).narrow(0, r * n, n);
    struct Case { ReduceOp op; at::Tensor expect; };
    for (const Case& c : {Case{ReduceOp::SUM, base * W + W * (W + 1) / 2.0},
                          Case{ReduceOp::AVG, base + (W + 1) / 2.0},
                          Case{ReduceOp::MAX, base + W}}) {
      at::Tensor out = at::full({n}, -7.0f);
      reduce_scatter_tensor(out, in, c.op);
      EXPECT_TRUE(out.allclose(c.expect)) << to_string(c.op) << " rank " << r;
      // [W, n] into [n]: the same chunks.
      at::Tensor out2 = at::empty({n});
      reduce_scatter_tensor(out2, in.view({W, n}), c.op);
      EXPECT_TRUE(out2.equal(out)) << to_string(c.op) << " rank " << r;
    }
    EXPECT_TRUE(in.equal(input_of(r, W * n))) << "input modified";
  });
}

TEST_P(ShardingTest, ReduceScatterListForm) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    std::vector<at::Tensor> inputs;
    for (int j = 0; j < W; ++j) inputs.push_back(input_of(r, n) * (j + 1));
    at::Tensor out = at::empty({n});
    reduce_scatter(out, inputs);
    // sum_i (base + i + 1) * (r + 1)
    at::Tensor expect = (at::arange(n, at::kFloat).remainder(1000) * W + W * (W + 1) / 2.0) * (r + 1);
    EXPECT_TRUE(out.allclose(expect)) << "rank " << r;
  });
}

TEST_P(ShardingTest, AllGatherIntoTensorPutsEveryRankInItsChunk) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    at::Tensor out = at::full({W * n}, -1.0f);
    all_gather_into_tensor(out, input_of(r, n));
    for (int i = 0; i < W; ++i) {
      EXPECT_TRUE(out.narrow(0, i * n, n).equal(input_of(i, n))) << "chunk " << i;
    }
    at::Tensor out2 = at::empty({W, n});
    all_gather_into_tensor_async(out2, input_of(r, n)).wait();
    EXPECT_TRUE(out2.view({-1}).equal(out));
  });
}

// FSDP's identity: gathering the reduce-scattered shards is the all_reduce.
TEST_P(ShardingTest, ReduceScatterThenAllGatherIsAllReduce) {
  const int W = world();
  const int64_t n = numel();
  run_ranks(W, [&](int r) {
    at::Tensor full = input_of(r, W * n) * 0.5;
    at::Tensor shard = at::empty({n});
    Work rs = reduce_scatter_tensor_async(shard, full, ReduceOp::AVG);
    rs.wait();
    at::Tensor gathered = at::empty({W * n});
    all_gather_into_tensor(gathered, shard);
    at::Tensor reduced = full.clone();
    all_reduce(reduced, ReduceOp::AVG);
    EXPECT_TRUE(gathered.allclose(reduced)) << "rank " << r;
  });
}

// The value rank `src` sends as row k of its piece for rank `dst`: exact in
// int64, so every row's origin is checked.
int64_t code(int src, int dst, int64_t k) { return src * 1000000000LL + dst * 10000000LL + k; }

at::Tensor piece(int src, int dst, int64_t rows) {
  return (at::arange(rows, at::kLong) + code(src, dst, 0)).unsqueeze(1).repeat({1, 3});
}

// Rows rank i sends to rank j: uneven, some zero, for every pair.
int64_t uneven(int i, int j, int64_t c) { return ((i + 2 * j) % 3) * c; }

TEST_P(ShardingTest, AllToAllSingleEvenAndUnevenPieces) {
  const int W = world();
  const int64_t c = std::min<int64_t>(numel(), 20000);  // rows per unit; 3 elements a row
  run_ranks(W, [&](int r) {
    for (bool even : {true, false}) {
      std::vector<at::Tensor> pieces;
      std::vector<int64_t> in_splits, out_splits;
      int64_t out_rows = 0;
      for (int j = 0; j < W; ++j) {
        const int64_t rows = even ? c : uneven(r, j, c);
        pieces.push_back(piece(r, j, rows));
        in_splits.push_back(rows);
        out_splits.push_back(even ? c : uneven(j, r, c));
        out_rows += out_splits.back();
      }
      at::Tensor out = at::full({out_rows, 3}, -1, at::kLong);
      if (even) {
        all_to_all_single(out, at::cat(pieces));
      } else {
        all_to_all_single(out, at::cat(pieces), out_splits, in_splits);
      }
      int64_t offset = 0;
      for (int i = 0; i < W; ++i) {
        EXPECT_TRUE(out.narrow(0, offset, out_splits[i]).equal(piece(i, r, out_splits[i])))
            << (even ? "even" : "uneven") << " from rank " << i << " on rank " << r;
        offset += out_splits[i];
      }
    }
  });
}

TEST_P(ShardingTest, AllToAllListForm) {
  const int W = world();
  const int64_t c = std::min<int64_t>(numel(), 20000);
  run_ranks(W, [&](int r) {
    std::vector<at::Tensor> inputs, outputs;
    for (int j = 0; j < W; ++j) {
      inputs.push_back(piece(r, j, uneven(r, j, c)).to(at::kDouble));
      outputs.push_back(at::full({uneven(j, r, c), 3}, -1.0, at::kDouble));
    }
    all_to_all(outputs, inputs);
    for (int i = 0; i < W; ++i) {
      EXPECT_TRUE(outputs[i].equal(piece(i, r, uneven(i, r, c)).to(at::kDouble)))
          << "from rank " << i << " on rank " << r;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, ShardingTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values<int64_t>(0, 1, 4, 1000, 100003)));

bool mentions(const std::exception_ptr& e, const std::string& text) {
  return message_of(e).find(text) != std::string::npos;
}

TEST(Sharding, BadArgumentsAreNamedBeforeAnythingMoves) {
  run_ranks(3, [](int r) {
    at::Tensor out = at::empty({4});
    expect_error([&] { reduce_scatter_tensor(out, at::ones({11})); },
                 "reduce_scatter_tensor: input is float32[11] (11 elements), but output is "
                 "float32[4]: input must hold world_size (3) times output's 4 elements (12)");
    expect_error([&] { all_gather_into_tensor(out, at::ones({2})); },
                 "all_gather_into_tensor: output is float32[4] (4 elements), but input is "
                 "float32[2]: output must hold world_size (3) times input's 2 elements (6)");
    expect_error([&] { reduce_scatter_tensor(out, at::ones({12}, at::kDouble)); },
                 "output is float32 but input is float64");
    at::Tensor ints = at::empty({1}, at::kInt);
    expect_error([&] { reduce_scatter_tensor(ints, at::ones({3}, at::kInt), ReduceOp::AVG); },
                 "ReduceOp::AVG needs a floating-point tensor");
    expect_error([&] { reduce_scatter(out, {at::ones({4}), at::ones({4})}); },
                 "reduce_scatter: inputs has 2 tensors; pass world_size (3)");
    expect_error([&] { reduce_scatter(out, {at::ones({4}), at::ones({5}), at::ones({4})}); },
                 "reduce_scatter: inputs[1] is float32[5] but output is float32[4]");
    at::Tensor rows = at::empty({4, 2});
    expect_error([&] { all_to_all_single(rows, at::ones({4, 2})); },
                 "input_split_sizes is empty (equal pieces), but 4 rows do not divide among "
                 "world_size 3 ranks");
    expect_error([&] { all_to_all_single(rows, at::ones({4, 2}), {2, 1, 1}, {2, 2, 1}); },
                 "input_split_sizes adds up to 5 rows, but the tensor has 4");
    expect_error([&] { all_to_all_single(rows, at::ones({4, 3}), {2, 1, 1}, {2, 1, 1}); },
                 "input's rows (float32[4, 3]) and output's (float32[4, 2]) differ in size");
    std::vector<at::Tensor> two(2, at::ones({1}));
    expect_error([&] { all_to_all(two, two); },
                 "all_to_all: inputs has 2 tensors and outputs 2; pass world_size (3)");
    (void)r;
    barrier();  // nothing above reached the backend: the ranks are in step
  });
}

TEST(Sharding, MismatchedAllToAllSizesAreNamedOnEveryRank) {
  auto errors = run_ranks_collect(3, [](int r) {
    // Rank 0 sends 2 rows to rank 2, which expects 1 from it.
    std::vector<int64_t> in = r == 0 ? std::vector<int64_t>{1, 1, 2} : std::vector<int64_t>{1, 1, 1};
    std::vector<int64_t> out{1, 1, 1};
    const int64_t in_rows = r == 0 ? 4 : 3;
    at::Tensor o = at::empty({3, 2});
    all_to_all_single(o, at::ones({in_rows, 2}), out, in);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(testing::is_a<InvalidArgument>(errors[r])) << "rank " << r << ": "
                                                           << message_of(errors[r]);
    EXPECT_TRUE(mentions(errors[r], "all_to_all_single: rank 0 sends 2 rows of 2 elements to "
                                    "rank 2 (input_split_sizes[2]), but rank 2 expects 1 rows "
                                    "of 2 (output_split_sizes[0])"))
        << message_of(errors[r]);
  }
  auto list_errors = run_ranks_collect(2, [](int r) {
    std::vector<at::Tensor> inputs{at::ones({2}), at::ones({r == 1 ? 3 : 2})};
    std::vector<at::Tensor> outputs{at::empty({2}), at::empty({2})};
    all_to_all(outputs, inputs);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(mentions(list_errors[r], "all_to_all: rank 1's inputs[1] has 3 elements, but "
                                         "rank 1's outputs[1] has 2"))
        << message_of(list_errors[r]);
  }
}

// bfloat16 (which PyTorch 1.13's Gloo cannot reduce: Note [bfloat16 over old
// Gloo]): the chunk of the bfloat16 all_reduce, bit for bit, and the float
// sum within bfloat16's rounding.
TEST(Sharding, Bfloat16ReduceScatterIsTheChunkOfTheAllReduce) {
  run_ranks(4, [](int r) {
    at::Tensor in = input_of(r, 4 * 300).to(at::kBFloat16);
    at::Tensor out = at::empty({300}, at::kBFloat16);
    reduce_scatter_tensor(out, in);
    at::Tensor all = in.clone();
    all_reduce(all);
    EXPECT_TRUE(out.equal(all.narrow(0, r * 300, 300))) << "rank " << r;
    at::Tensor f = in.to(at::kFloat);
    all_reduce(f);
    EXPECT_TRUE(out.to(at::kFloat).allclose(f.narrow(0, r * 300, 300), 1e-2)) << "rank " << r;
  });
}

TEST(Sharding, RankThatSkipsAReduceScatterTimesOutOnTheOthers) {
  testing::ThreadWorldOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor out = at::empty({8});
    if (r == 0) reduce_scatter_tensor(out, at::ones({16}));
  }, o);
  ASSERT_TRUE(testing::is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  EXPECT_TRUE(mentions(errors[0], "reduce_scatter_tensor #0 on rank 0 of 2 (gloo) timed out"))
      << message_of(errors[0]);
  EXPECT_FALSE(errors[1]);
}

}  // namespace
}  // namespace ddp
