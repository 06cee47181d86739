// Metrics reduced across ranks (threads): sums, unweighted and
// sample-weighted means, exact int64 counts beyond 2^53, the Metrics
// accumulator with names added in different orders, and its errors.
#include "ddp/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ddp/error.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::is_a;
using testing::message_of;
using testing::run_ranks;
using testing::run_ranks_collect;

TEST(ReduceFunctions, SumMeanAndWeightedMeanOnEveryRank) {
  for (int world : {1, 2, 3, 4}) {
    run_ranks(world, [&](int r) {
      // Rank r saw r+1 samples of value 10*r + 0.5.
      double expect_sum = 0, expect_value_sum = 0, expect_weight = 0;
      for (int k = 0; k < world; ++k) {
        expect_sum += k + 1;
        expect_value_sum += (10.0 * k + 0.5) * (k + 1);
        expect_weight += k + 1;
      }
      EXPECT_EQ(all_reduce_sum(r + 1.0), expect_sum) << "world " << world;
      EXPECT_EQ(all_reduce_mean(r + 1.0), expect_sum / world);
      EXPECT_EQ(all_reduce_weighted_mean((10.0 * r + 0.5) * (r + 1), r + 1.0),
                expect_value_sum / expect_weight);
    });
  }
}

TEST(ReduceFunctions, WeightedMeanDiffersFromMeanOfMeans) {
  // Rank 0: 1 sample of loss 4; rank 1: 3 samples of loss 0. The job's loss
  // is 1, not the mean of the ranks' means (2).
  run_ranks(2, [](int r) {
    double mean = r == 0 ? 4.0 : 0.0;
    double n = r == 0 ? 1.0 : 3.0;
    EXPECT_EQ(all_reduce_weighted_mean(mean * n, n), 1.0);
    EXPECT_EQ(all_reduce_mean(mean), 2.0);
  });
}

TEST(ReduceFunctions, ZeroTotalWeightIsNaNEverywhere) {
  run_ranks(3, [](int) { EXPECT_TRUE(std::isnan(all_reduce_weighted_mean(0, 0))); });
}

TEST(ReduceFunctions, NegativeWeightIsRejectedBeforeCommunicating) {
  // Every rank passes a bad weight, so none waits for the others.
  auto errors = run_ranks_collect(2, [](int) { all_reduce_weighted_mean(1, -2); });
  for (const auto& e : errors) {
    EXPECT_TRUE(is_a<InvalidArgument>(e)) << message_of(e);
    EXPECT_NE(message_of(e).find("must be >= 0"), std::string::npos) << message_of(e);
  }
}

TEST(ReduceFunctions, CountIsExactBeyondDoublePrecision) {
  run_ranks(3, [](int r) {
    // 2^60 + r: the sum 3 * 2^60 + 3 is not representable in a double.
    const int64_t big = (int64_t{1} << 60) + r;
    EXPECT_EQ(all_reduce_count(big), 3 * (int64_t{1} << 60) + 3);
    EXPECT_EQ(all_reduce_count(r == 1 ? -7 : 2), -3);
  });
}

TEST(ReduceFunctions, NeedAProcessGroup) {
  try {
    all_reduce_sum(1.0);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("init_process_group"), std::string::npos)
        << e.what();
  }
}

TEST(Metrics, ReducesEveryKindInOneCallOnEveryRank) {
  const int world = 3;
  run_ranks(world, [&](int r) {
    Metrics m;
    // Ranks add in different orders; names are matched, not positions.
    if (r % 2 == 0) {
      m.add_sum("loss_sum", 1.5 * r);
      m.add_mean("loss", 2.0 * r, r + 1);  // batch mean 2r over r+1 samples
      m.add_mean("loss", 1.0, 1);
      m.add_count("correct", (int64_t{1} << 55) + r);
    } else {
      m.add_count("correct", (int64_t{1} << 55) + r);
      m.add_mean("loss", 1.0, 1);
      m.add_mean("loss", 2.0 * r, r + 1);
      m.add_sum("loss_sum", 1.5 * r);
    }
    ReducedMetrics out = m.all_reduce();
    // loss: sum_r (2r(r+1) + 1) / sum_r (r+2) = (0+1 + 4+1 + 12+1) / (2+3+4)
    EXPECT_EQ(out.value("loss"), 19.0 / 9.0);
    EXPECT_EQ(out.at("loss").weight, 9.0);
    EXPECT_EQ(out.count("loss"), 6);  // add_mean calls over all ranks
    EXPECT_EQ(out.value("loss_sum"), 1.5 * (0 + 1 + 2));
    EXPECT_EQ(out.count("correct"), 3 * (int64_t{1} << 55) + 3);
    EXPECT_EQ(out.at("correct").kind, MetricKind::kCount);
    // Local values are untouched by reduce().
    EXPECT_EQ(m.local().count("correct"), (int64_t{1} << 55) + r);
  });
}

TEST(Metrics, SameResultAsOneProcessSeeingAllTheData) {
  // 10 batches of different sizes split round-robin over 3 ranks must give
  // what one process computes over all of them.
  const int world = 3;
  Metrics all;
  for (int b = 0; b < 10; ++b) all.add_mean("loss", 0.1 * b + 0.25, 1 + b % 4);
  const double expect = all.local().value("loss");
  run_ranks(world, [&](int r) {
    Metrics m;
    m.add_mean("loss", 0, 0);  // a rank without batches still takes part
    for (int b = r; b < 10; b += world) m.add_mean("loss", 0.1 * b + 0.25, 1 + b % 4);
    EXPECT_DOUBLE_EQ(m.all_reduce().value("loss"), expect);
  });
}

TEST(Metrics, DifferentNamesOnRanksAreAMismatchOnEveryRank) {
  auto errors = run_ranks_collect(2, [](int r) {
    Metrics m;
    m.add_mean("loss", 1.0);
    m.add_count(r == 0 ? "correct" : "wrong", 1);
    m.all_reduce();
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(is_a<MismatchError>(e)) << message_of(e);
    EXPECT_NE(message_of(e).find("different metric names"), std::string::npos);
    EXPECT_NE(message_of(e).find("loss:mean"), std::string::npos) << message_of(e);
  }
}

TEST(Metrics, ADifferentNumberOfMetricsIsAMismatchOnEveryRank) {
  testing::ThreadWorldOptions o;
  o.timeout = std::chrono::seconds(5);
  auto errors = run_ranks_collect(2, [](int r) {
    Metrics m;
    m.add_mean("loss", 1.0);
    if (r == 1) m.add_count("extra", 1);
    m.all_reduce();
  }, o);
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_TRUE(is_a<MismatchError>(errors[r])) << "rank " << r << ": " << message_of(errors[r]);
  }
  EXPECT_NE(message_of(errors[1]).find("this rank has {extra:count, loss:mean}"),
            std::string::npos) << message_of(errors[1]);
}

TEST(Metrics, ARankThatAddedNothingContributesZeros) {
  // Rank 1's shard was empty: it added no metric at all.
  for (int world : {2, 3}) {
    std::vector<ReducedMetrics> results(world);
    run_ranks(world, [&](int r) {
      Metrics m;
      if (r != 1) {
        m.add_mean("loss", 2.0 + r, 4);
        m.add_count("correct", 3);
        m.add_sum("batches", 1);
      }
      results[r] = m.all_reduce();
    });
    for (int r = 0; r < world; ++r) {
      const ReducedMetrics& got = results[r];
      ASSERT_EQ(got.entries().size(), 3u) << "rank " << r;
      const int others = world - 1;
      double loss = world == 2 ? 2.0 : (2.0 * 4 + 4.0 * 4) / 8;
      EXPECT_DOUBLE_EQ(got.value("loss"), loss) << "rank " << r;
      EXPECT_EQ(got.count("correct"), 3 * others) << "rank " << r;
      EXPECT_DOUBLE_EQ(got.value("batches"), others) << "rank " << r;
    }
  }
  // Every rank empty: an empty result, no error.
  run_ranks(2, [](int) { EXPECT_TRUE(Metrics().all_reduce().entries().empty()); });
}

TEST(Metrics, AddingANameWithAnotherKindThrows) {
  Metrics m;
  m.add_mean("loss", 1.0);
  try {
    m.add_count("loss", 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "metric 'loss' was added as a mean and is now added as a "
                 "count; use one kind per name");
  }
  EXPECT_THROW(m.add_mean("x", 1.0, -1.0), InvalidArgument);
  EXPECT_THROW(m.add_mean("x", 1.0, std::nan("")), InvalidArgument);
}

TEST(Metrics, LocalResultFormattingAndUnknownNames) {
  Metrics m;
  EXPECT_TRUE(m.empty());
  m.add_mean("loss", 0.5, 2);
  m.add_mean("loss", 0.25, 2);
  m.add_count("samples", 4);
  m.add_sum("time", 1.25);
  ReducedMetrics r = m.local();
  EXPECT_EQ(r.value("loss"), 0.375);
  EXPECT_EQ(r.to_string(), "loss=0.375 samples=4 time=1.25");
  EXPECT_FALSE(r.contains("acc"));
  try {
    r.value("acc");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("metric 'acc' was not added (known: "
                                         "loss, samples, time)"),
              std::string::npos)
        << e.what();
  }
  m.reset();
  EXPECT_TRUE(m.empty());
}

}  // namespace
}  // namespace ddp
