// The rank-process harness itself (tests/support/process_world.h): ranks
// spawned as processes of this binary join one group, their tensors come
// back, and a rank that fails is a failure that shows its output.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ddp/collectives.h"
#include "ddp/process_group.h"
#include "support/process_world.h"

namespace ddp {
namespace {

TEST(RankProcesses, TwoProcessesAllReduceAndBringTheirTensorsBack) {
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [](int r) {
      at::Tensor t = torch::full({4}, r + 1.0);
      all_reduce(t);
      testing::save_tensors("sum", {t, torch::tensor({int64_t{::getpid()}})});
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  const auto r0 = ranks.load_tensors(0, "sum"), r1 = ranks.load_tensors(1, "sum");
  ASSERT_EQ(r0.size(), 2u);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_TRUE(r0[0].equal(torch::full({4}, 3.0)));
  EXPECT_TRUE(r1[0].equal(torch::full({4}, 3.0)));
  EXPECT_NE(r0[1].item<int64_t>(), r1[1].item<int64_t>()) << "the ranks were one process";
  EXPECT_NE(r0[1].item<int64_t>(), int64_t{::getpid()});
}

TEST(RankProcesses, AFailingRankIsAFailureWithItsOutput) {
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [](int r) {
      if (r == 1) throw std::runtime_error("rank 1 breaks here on purpose");
    });
    return;
  }
  EXPECT_NONFATAL_FAILURE(
      {
        const testing::RankProcesses ranks(2);
        EXPECT_FALSE(ranks.ok());
      },
      "rank 1 breaks here on purpose");
}

}  // namespace
}  // namespace ddp
