// The stall inspector and debug mode (src/collective_monitor.cc): mismatched
// collectives raise MismatchError on every rank instead of crashing or
// hanging; stalls are reported with who has not arrived and what it did
// last; timeouts carry the same facts.
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <thread>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/models.h"
#include "support/scoped_env.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

using std::chrono::milliseconds;

bool has(const std::exception_ptr& e, const std::string& part) {
  return message_of(e).find(part) != std::string::npos;
}

TEST(DebugMode, DifferentOperationsRaiseOnEveryRank) {
  ScopedEnv debug("DDP_DEBUG", "1");
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::ones({4});
    all_reduce(t);  // the same on both: passes the check
    if (r == 0) {
      barrier();
    } else {
      all_reduce(t);
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(is_a<MismatchError>(errors[r])) << r << ": " << message_of(errors[r]);
    EXPECT_TRUE(has(errors[r], "collective #1 differs across ranks: rank 0 called barrier #1 on "
                               "rank 0 of 2 (gloo) [barrier] but rank 1 called all_reduce #1 on "
                               "rank 1 of 2 (gloo) [all_reduce SUM float32[4]]"))
        << message_of(errors[r]);
  }
}

TEST(DebugMode, DifferentShapesRaiseInsteadOfAborting) {
  ScopedEnv debug("DDP_DEBUG", "1");
  auto errors = run_ranks_collect(3, [](int r) {
    at::Tensor t = at::ones({r == 2 ? 5 : 4});
    all_reduce(t);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(has(errors[r], "but rank 2 called all_reduce #0 on rank 2 of 3 (gloo) "
                               "[all_reduce SUM float32[5]]"))
        << message_of(errors[r]);
  }
}

TEST(DebugMode, UnevenInputsWithoutJoinRaiseOnBothRanks) {
  ScopedEnv debug("DDP_DEBUG", "1");
  auto errors = run_ranks_collect(2, [](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    for (int i = 0; i < 2 + r; ++i) model(at::ones({4, 8})).sum().backward();
    barrier();  // rank 0 ends its epoch while rank 1 still trains
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(is_a<MismatchError>(errors[r])) << message_of(errors[r]);
    EXPECT_TRUE(has(errors[r], "all_reduce of gradient bucket 0 of 1 (iteration 2)"))
        << message_of(errors[r]);
  }
}

TEST(StallInspector, WarnsWhoHasNotArrivedThenCompletes) {
  ThreadWorldOptions o;
  ScopedEnv stall_warning("DDP_STALL_WARNING_S", "0.4");
  ::testing::internal::CaptureStderr();
  run_ranks(2, [](int r) {
    at::Tensor t = at::ones({4});
    barrier();
    if (r == 1) std::this_thread::sleep_for(milliseconds(1500));
    all_reduce(t);
    EXPECT_TRUE(t.equal(at::ones({4}) * 2));
  }, o);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[rank0]: WARNING: ddp: all_reduce #1 on rank 0 of 2 (gloo) has waited"),
            std::string::npos) << err;
  EXPECT_NE(err.find("rank 1 has not reached it: at step -1, last started barrier #0 on rank 1 of 2 "
                     "(gloo) and finished it"),
            std::string::npos) << err;
}

TEST(StallInspector, TimeoutNamesTheMissingRankAndItsLastCollective) {
  ThreadWorldOptions o;
  o.timeout = milliseconds(2000);
  auto errors = run_ranks_collect(3, [](int r) {
    at::Tensor t = at::ones({4});
    all_reduce(t);
    if (r != 2) all_reduce(t);  // rank 2 skips it
  }, o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(is_a<TimeoutError>(errors[r])) << message_of(errors[r]);
    EXPECT_TRUE(has(errors[r], "rank 2 has not reached it: at step -1, last started all_reduce #0"))
        << message_of(errors[r]);
    EXPECT_FALSE(has(errors[r], "rank " + std::to_string(1 - r) + " has not reached it"))
        << message_of(errors[r]);
  }
  EXPECT_FALSE(errors[2]);
}

}  // namespace
}  // namespace ddp::testing
