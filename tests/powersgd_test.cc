// PowerSGD (powersgd.h): before start_powerSGD_iter the plain all_reduce;
// at full rank lossless; at rank 1 the large matrices only are compressed,
// with the sizes PyTorch's compression stats give, replicas identical and
// the seed honoured; several buckets, warm start and error feedback each
// change the numbers; bad options refused as PyTorch refuses them.
// ddp_oracle_test compares the hooks with Python's.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "ddp/error.h"
#include "ddp/powersgd.h"
#include "support/branchy_training.h"
#include "support/model_state.h"

namespace ddp::testing {
namespace {

// Rank 0's state after `steps` steps with a PowerSGD state built from `o`
// on every rank (each rank its own state, as in PyTorch).
std::vector<NamedState> train_powersgd(const PowerSGDOptions& o, bool batched, int steps,
                                       std::vector<PowerSGDState::CompressionStats>* stats = nullptr,
                                       double bucket_cap_mb = 25) {
  TrainRun run;
  run.steps = steps;
  run.options.bucket_cap_mb = bucket_cap_mb;
  run.options.first_bucket_cap_mb = std::min(bucket_cap_mb, 1.0);
  std::vector<std::shared_ptr<PowerSGDState>> states;
  for (int r = 0; r < run.world; ++r) states.push_back(std::make_shared<PowerSGDState>(o));
  run.setup = [&](auto& model, int r) {
    if (batched) {
      model.register_comm_hook(states[r], batched_powerSGD_hook, "batched_powerSGD");
    } else {
      model.register_comm_hook(states[r], powerSGD_hook, "powerSGD");
    }
  };
  auto out = train(run);
  if (stats) {
    for (const auto& s : states) stats->push_back(s->compression_stats());
  }
  return out;
}

TrainRun plain_steps(int steps) {
  TrainRun run;
  run.steps = steps;
  return run;
}

TEST(PowerSgd, BeforeStartIterItIsThePlainAllReduce) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 3;
  auto got = train_powersgd(o, false, 3);
  auto want = train(plain_steps(3));
  expect_same_state(got[0], want[0], "iterations 0..2", 1e-6);
}

// At full rank, and with every matrix compressed (min_compression_rate 0),
// P·Qᵀ reproduces the average exactly up to rounding: the QR path (rank > 2)
// and the vectors (n x 1 matrices) included.
TEST(PowerSgd, FullRankIsLossless) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 2;
  o.min_compression_rate = 0;
  o.matrix_approximation_rank = 16;
  auto want = train(plain_steps(4));
  expect_same_state(train_powersgd(o, false, 4)[0], want[0], "powerSGD at full rank", 1e-4);
  o.matrix_approximation_rank = 17;  // ceil(sqrt(280 elements))
  expect_same_state(train_powersgd(o, true, 4)[0], want[0], "batched at full rank", 1e-4);
}

TEST(PowerSgd, RankOneCompressesTheLargeMatricesOnlyAndKeepsReplicasIdentical) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 2;
  std::vector<PowerSGDState::CompressionStats> stats;
  auto got = train_powersgd(o, false, 4, &stats);
  // Branchy per compressed iteration: body.weight 16x8 -> (16+8)*1, head and
  // aux weights 4x16 -> 20 each; the biases (16, 4, 4) stay: 280 -> 88.
  for (const auto& s : stats) {
    EXPECT_EQ(s.numel_before, 2 * 280);
    EXPECT_EQ(s.numel_after, 2 * 88);
    EXPECT_DOUBLE_EQ(s.rate, 280.0 / 88.0);
  }
  expect_same_state(got[0], got[1], "replicas", 0);
  // The compression is real: rank 1 loses information.
  EXPECT_GT(max_diff(got[0], train(plain_steps(4))[0]), 1e-4);
  // Same seed, same numbers; another seed, others.
  expect_same_state(got[0], train_powersgd(o, false, 4)[0], "same seed", 0);
  o.random_seed = 7;
  EXPECT_GT(max_diff(got[0], train_powersgd(o, false, 4)[0]), 1e-7);
}

// Several buckets (~100-byte caps), each with its own P, Q and error; no
// warm start (P and Q drawn anew each time) and no error feedback.
TEST(PowerSgd, SeveralBucketsWithoutWarmStartOrErrorFeedback) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 2;
  o.min_compression_rate = 0;
  o.matrix_approximation_rank = 16;
  o.warm_start = false;
  o.use_error_feedback = false;
  auto want = train(plain_steps(4));
  expect_same_state(train_powersgd(o, false, 4, nullptr, 1e-4)[0], want[0],
                    "full rank, several buckets", 1e-4);
  o.matrix_approximation_rank = 17;
  expect_same_state(train_powersgd(o, true, 4, nullptr, 1e-4)[0], want[0],
                    "batched, full rank, several buckets", 1e-4);
  // At rank 1 the options change the numbers (each path is taken).
  o.matrix_approximation_rank = 1;
  o.min_compression_rate = 2;
  auto plain = train_powersgd(o, false, 4, nullptr, 1e-4);
  expect_same_state(plain[0], plain[1], "replicas", 0);
  o.use_error_feedback = true;
  auto feedback = train_powersgd(o, false, 4, nullptr, 1e-4);
  EXPECT_GT(max_diff(plain[0], feedback[0]), 1e-6);
  o.warm_start = true;
  EXPECT_GT(max_diff(feedback[0], train_powersgd(o, false, 4, nullptr, 1e-4)[0]), 1e-6);
}

TEST(PowerSgd, BadOptionsAreRefusedAsInPyTorch) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 1;
  try {
    PowerSGDState s(o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("start_powerSGD_iter is 1; it must be > 1"),
              std::string::npos);
  }
  o.use_error_feedback = false;
  o.warm_start = false;
  EXPECT_NO_THROW(PowerSGDState{o});
  o.matrix_approximation_rank = 0;
  EXPECT_THROW(PowerSGDState{o}, InvalidArgument);
}

}  // namespace
}  // namespace ddp::testing
