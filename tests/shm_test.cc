// The intra-host shared-memory all_reduce (src/shm/, Note [Shared-memory
// all-reduce]) with ranks as threads: every dtype and op it takes, one-shot
// and two-shot sizes, chunking, exact and bitwise-identical results, the
// same values as Gloo, the switches that turn it off, timeouts; and its
// segments (mode 0600, unguessable names, stale-name cleanup).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/remainder.h>

#include <cstdlib>
#include <mutex>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "ddp/process_group.h"
#include "shm/segment.h"
#include "support/scoped_env.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

using std::chrono::milliseconds;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Rank r's input: small integers in [-3, 3], exact in every dtype (also
// bfloat16's 8-bit mantissa for products of up to 4 of them).
at::Tensor input(int rank, int64_t n, at::ScalarType dtype) {
  at::Tensor i = at::arange(n, at::kLong);
  return at::remainder(i * 7 + rank * 13, 7).sub(3).to(dtype);
}

at::Tensor expected(int world, int64_t n, at::ScalarType dtype, ReduceOp op) {
  at::Tensor acc = input(0, n, at::kDouble);
  for (int r = 1; r < world; ++r) {
    at::Tensor x = input(r, n, at::kDouble);
    switch (op) {
      case ReduceOp::SUM: acc = acc + x; break;
      case ReduceOp::MIN: acc = at::minimum(acc, x); break;
      case ReduceOp::MAX: acc = at::maximum(acc, x); break;
      case ReduceOp::PRODUCT: acc = acc * x; break;
      default: break;
    }
  }
  return acc.to(dtype);
}

struct Case {
  int world;
  int64_t count;
  at::ScalarType dtype;
  ReduceOp op;
};

TEST(SharedMemory, CoLocatedThreadRanksUseIt) {
  for (int world : {2, 3}) {
    run_ranks(world, [world](int) {
      EXPECT_EQ(default_group()->shared_memory_ranks(), world);
      EXPECT_EQ(default_group()->shared_memory_off_reason(), "");
    });
  }
  run_ranks(1, [](int) { EXPECT_EQ(default_group()->shared_memory_ranks(), 0); });
}

TEST(SharedMemory, ExactOnEveryDtypeOpAndSize) {
  std::vector<Case> cases;
  for (int world : {2, 3, 4}) {
    for (int64_t count : {1, 17, 1000, 100003}) {  // 100003 floats: two-shot
      for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
        for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::PRODUCT}) {
          if (world == 4 || count == 17) cases.push_back({world, count, dtype, op});
        }
      }
    }
  }
  // Staging of 32 MiB: 100003 floats go two-shot in one chunk; of 64 KiB:
  // one-shot in 7 chunks.
  for (size_t staging : {size_t{0}, size_t{64} << 10})
  for (int world : {2, 3, 4}) {
    ThreadWorldOptions o;
    o.shared_memory_staging_bytes = staging;
    run_ranks(world, [&](int r) {
      ASSERT_EQ(default_group()->shared_memory_ranks(), world)
          << default_group()->shared_memory_off_reason();
      for (const Case& c : cases) {
        if (c.world != world) continue;
        at::Tensor t = input(r, c.count, c.dtype);
        all_reduce(t, c.op);
        ASSERT_TRUE(t.equal(expected(world, c.count, c.dtype, c.op)))
            << "world " << world << " count " << c.count << " " << c.dtype << " "
            << to_string(c.op) << " rank " << r;
      }
    }, o);
  }
}

// Float sums of arbitrary values: bitwise identical on every rank, and
// equal to Gloo's within rounding; AVG too.
TEST(SharedMemory, FloatSumsAreIdenticalOnEveryRankAndMatchGloo) {
  const int W = 3;
  const int64_t n = 300001;
  std::vector<at::Tensor> inputs;
  torch::manual_seed(5);
  for (int r = 0; r < W; ++r) inputs.push_back(at::randn({n}));
  auto run = [&](bool shm, ReduceOp op) {
    std::vector<at::Tensor> out(W);
    ThreadWorldOptions o;
    o.shared_memory = shm;
    run_ranks(W, [&](int r) {
      EXPECT_EQ(default_group()->shared_memory_ranks(), shm ? W : 0);
      at::Tensor t = inputs[r].clone();
      all_reduce(t, op);
      out[r] = t;
    }, o);
    return out;
  };
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
    auto shm = run(true, op);
    auto gloo = run(false, op);
    for (int r = 0; r < W; ++r) {
      EXPECT_TRUE(shm[r].equal(shm[0])) << "rank " << r << " differs bitwise";
      EXPECT_TRUE(shm[r].allclose(gloo[r], 1e-5, 1e-5)) << to_string(op) << " rank " << r;
    }
  }
}

TEST(SharedMemory, TurnedOffByTheOptionAndByDdpShm) {
  ThreadWorldOptions o;
  o.shared_memory = false;
  run_ranks(2, [](int) {
    EXPECT_EQ(default_group()->shared_memory_ranks(), 0);
    EXPECT_TRUE(has(default_group()->shared_memory_off_reason(), "disabled"));
    at::Tensor t = at::ones({5});
    all_reduce(t);
    EXPECT_TRUE(t.eq(2).all().item<bool>());
  }, o);
  ScopedEnv off("DDP_SHM", "0");
  run_ranks(2, [](int) { EXPECT_EQ(default_group()->shared_memory_ranks(), 0); });
}

TEST(SharedMemory, ARankThatSkipsTheCollectiveTimesOutNamingIt) {
  ThreadWorldOptions o;
  o.timeout = milliseconds(1500);
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::ones({8});
    all_reduce(t);
    if (r == 0) all_reduce(t);  // rank 1 skips it
  }, o);
  ASSERT_TRUE(is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  EXPECT_TRUE(has(message_of(errors[0]), "rank 1 has not reached it"))
      << message_of(errors[0]);
  EXPECT_TRUE(has(message_of(errors[0]), "all_reduce #1")) << message_of(errors[0]);
  // The advice once, not twice in other words.
  const std::string what = message_of(errors[0]);
  const size_t advice = what.find("skipped this collective");
  ASSERT_NE(advice, std::string::npos) << what;
  EXPECT_EQ(what.find("skipped this collective", advice + 1), std::string::npos) << what;
  EXPECT_EQ(what.find("may have stopped, hung"), std::string::npos) << what;
  EXPECT_FALSE(errors[1]);
}

// Broadcast from every root, one chunk and several (staging of 64 KiB),
// every dtype the path takes: each rank ends with
// the root's values exactly.
TEST(SharedMemory, BroadcastGivesEveryRankTheRootsValues) {
  for (size_t staging : {size_t{0}, size_t{64} << 10}) {
    ThreadWorldOptions o;
    o.shared_memory_staging_bytes = staging;
    run_ranks(3, [](int r) {
      ASSERT_EQ(default_group()->shared_memory_ranks(), 3);
      for (int root = 0; root < 3; ++root) {
        for (int64_t count : {1, 1000, 100003}) {
          for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kInt, at::kLong}) {
            at::Tensor t = input(r, count, dtype);
            broadcast(t, root);
            ASSERT_TRUE(t.equal(input(root, count, dtype)))
                << "root " << root << " count " << count << " " << dtype << " rank " << r;
          }
        }
      }
    }, o);
  }
}

// Ranks that broadcast from different roots are out of step: each says so
// (the shared-memory path's own check: Gloo would mix the buffers silently).
TEST(SharedMemory, BroadcastsFromDifferentRootsAreOutOfStepOnEveryRank) {
  ThreadWorldOptions o;
  o.timeout = milliseconds(5000);
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::ones({16});
    broadcast(t, r);
  }, o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(is_a<MismatchError>(errors[r])) << "rank " << r << ": " << message_of(errors[r]);
    EXPECT_TRUE(has(message_of(errors[r]), "runs broadcast from rank"))
        << message_of(errors[r]);
  }
}

TEST(SharedMemorySegment, IsPrivateToItsUserAndNamedUnguessably) {
  const std::string name = shm::segment_name("0123456789abcdef0123456789abcdef", ::getpid(), 0);
  EXPECT_EQ(name, "/ddp-0123456789abcdef0123456789abcdef-" + std::to_string(::getpid()) + "-0");
  {
    shm::Segment s = shm::Segment::create(name, 8192, 4096);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, ::getuid());
    EXPECT_THROW(shm::Segment::create(name, 8192, 0), CommError);  // O_EXCL
    s.unlink();
    EXPECT_NE(::stat(("/dev/shm" + name).c_str(), &st), 0);
    static_cast<char*>(s.data())[8191] = 1;  // still mapped after unlink
  }
}

TEST(SharedMemorySegment, StaleNamesOfDeadProcessesAreRemoved) {
  pid_t child = ::fork();
  if (child == 0) std::_Exit(0);
  ::waitpid(child, nullptr, 0);  // a pid that is gone
  const std::string stale = shm::segment_name("feedfacefeedfacefeedfacefeedface", child, 1);
  const std::string live = shm::segment_name("feedfacefeedfacefeedfacefeedface", ::getpid(), 1);
  shm::Segment a = shm::Segment::create(stale, 4096, 0);
  shm::Segment b = shm::Segment::create(live, 4096, 0);
  shm::remove_stale_segments();
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm" + stale).c_str(), &st), 0) << "the dead creator's name stays";
  EXPECT_EQ(::stat(("/dev/shm" + live).c_str(), &st), 0) << "a live creator's name went";
}

}  // namespace
}  // namespace ddp::testing
