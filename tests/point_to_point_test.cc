// send/recv/isend/irecv/batch_isend_irecv (point_to_point.h) and subgroups
// (subgroup.h) over N ranks as threads: every ordered pair of ranks, any
// source, tags, a ring exchange, the collectives' numbering left alone,
// timeouts; subgroups' values, renumbered ranks, non-members, nesting, and
// errors.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include "ddp/collectives_sharding.h"
#include "ddp/error.h"
#include "ddp/point_to_point.h"
#include "ddp/subgroup.h"
#include "support/expect_error.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::expect_error;
using testing::message_of;
using testing::run_ranks;
using testing::run_ranks_collect;

bool mentions(const std::exception_ptr& e, const std::string& text) {
  return message_of(e).find(text) != std::string::npos;
}

// What rank `src` sends rank `dst`: 1000 values that name both.
at::Tensor message(int src, int dst, int64_t n = 1000) {
  return at::arange(n, at::kDouble) + src * 100000.0 + dst * 10000.0;
}

TEST(PointToPoint, SendAndRecvBetweenEveryOrderedPair) {
  const int W = 4;
  run_ranks(W, [&](int r) {
    for (int src = 0; src < W; ++src) {
      for (int dst = 0; dst < W; ++dst) {
        if (src == dst) continue;
        if (r == src) send(message(src, dst), dst, /*tag=*/dst);
        if (r == dst) {
          at::Tensor got = at::empty({1000}, at::kDouble);
          EXPECT_EQ(recv(got, src, /*tag=*/dst), src);
          EXPECT_TRUE(got.equal(message(src, dst))) << src << " -> " << dst;
        }
      }
    }
  });
}

TEST(PointToPoint, RecvFromAnySourceSaysWhoSent) {
  run_ranks(3, [](int r) {
    if (r == 2) send(message(2, 0), 0);
    if (r == 0) {
      at::Tensor got = at::empty({1000}, at::kDouble);
      EXPECT_EQ(recv(got), 2);
      EXPECT_TRUE(got.equal(message(2, 0)));
    }
  });
}

TEST(PointToPoint, TagsKeepMessagesApart) {
  run_ranks(2, [](int r) {
    if (r == 0) {
      Work late = isend(message(0, 1) + 1, 1, /*tag=*/7);
      Work early = isend(message(0, 1), 1, /*tag=*/3);
      late.wait();
      early.wait();
    } else {
      at::Tensor three = at::empty({1000}, at::kDouble), seven = at::empty({1000}, at::kDouble);
      Work a = irecv(three, 0, 3);
      Work b = irecv(seven, 0, 7);
      a.wait();
      b.wait();
      EXPECT_TRUE(three.equal(message(0, 1)));
      EXPECT_TRUE(seven.equal(message(0, 1) + 1));
    }
  });
}

TEST(PointToPoint, RingExchangeInOneBatch) {
  for (int W : {2, 3, 5}) {
    run_ranks(W, [W](int r) {
      const int next = (r + 1) % W, prev = (r + W - 1) % W;
      at::Tensor got = at::empty({1000}, at::kDouble);
      std::vector<Work> works = batch_isend_irecv({{P2POp::Kind::kSend, message(r, next), next},
                                                   {P2POp::Kind::kRecv, got, prev}});
      ASSERT_EQ(works.size(), 2u);
      for (Work& w : works) w.wait();
      EXPECT_TRUE(got.equal(message(prev, r))) << "W " << W << " rank " << r;
    });
  }
}

// Note [Point-to-point numbering]: a send between ranks 0 and 1 leaves the
// collectives' numbers alone, so rank 2's first all_reduce is #0 too.
TEST(PointToPoint, SendsDoNotCountAmongTheCollectives) {
  testing::ThreadWorldOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  auto errors = run_ranks_collect(3, [](int r) {
    at::Tensor t = at::ones({4});
    if (r == 0) send(t, 1);
    if (r == 1) recv(t, 0);
    if (r != 1) all_reduce(t);  // rank 1 never comes: a timeout, numbered #0
  }, o);
  ASSERT_TRUE(testing::is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  EXPECT_TRUE(mentions(errors[0], "all_reduce #0 on rank 0 of 3")) << message_of(errors[0]);
  EXPECT_TRUE(mentions(errors[2], "all_reduce #0 on rank 2 of 3")) << message_of(errors[2]);
  EXPECT_FALSE(errors[1]);
}

TEST(PointToPoint, ARecvNobodyAnswersTimesOutNamingThePeer) {
  auto errors = run_ranks_collect(2, [](int r) {
    at::Tensor t = at::empty({4});
    CollectiveOptions o;
    o.timeout = std::chrono::milliseconds(500);
    if (r == 0) recv(t, 1, 5, o);
  });
  ASSERT_TRUE(testing::is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  EXPECT_TRUE(mentions(errors[0], "recv from rank 1 (tag 5) (point-to-point #0) on rank 0 of 2 "
                                  "(gloo) timed out"))
      << message_of(errors[0]);
}

TEST(PointToPoint, BadPeersAreNamed) {
  run_ranks(2, [](int r) {
    at::Tensor t = at::ones({2});
    expect_error([&] { send(t, r); }, "send: dst=" + std::to_string(r) + " is this rank itself");
    expect_error([&] { send(t, 2); }, "send: dst=2 is not a rank of the group (size 2)");
    expect_error([&] { recv(t, -3); }, "recv: src=-3 is not a rank of the group");
    expect_error([&] { irecv(t, kAnySource); }, "irecv: src must be a rank");
    at::Tensor strided = at::ones({4, 4}).t();
    expect_error([&] { send(strided, 1 - r); }, "send: tensor must be contiguous");
  });
}

TEST(Subgroup, MembersRenumberedAndReducedAmongThemselves) {
  run_ranks(4, [](int r) {
    ProcessGroupPtr even = new_group({2, 0});  // sorted: parent 0 -> 0, parent 2 -> 1
    ProcessGroupPtr odd = new_group({1, 3}, {nullptr, std::nullopt, "odd"});
    ProcessGroupPtr mine = r % 2 == 0 ? even : odd;
    ProcessGroupPtr other = r % 2 == 0 ? odd : even;
    EXPECT_TRUE(is_member(*mine));
    EXPECT_FALSE(is_member(*other));
    EXPECT_EQ(mine->rank(), r / 2);
    EXPECT_EQ(mine->size(), 2);
    EXPECT_EQ(other->rank(), -1);
    at::Tensor t = at::full({100003}, static_cast<float>(r));
    all_reduce(t, ReduceOp::SUM, {mine});
    const float expect = r % 2 == 0 ? 0 + 2 : 1 + 3;
    EXPECT_TRUE(t.equal(at::full({100003}, expect))) << "rank " << r;
    at::Tensor b = at::full({3}, static_cast<float>(r));
    broadcast(b, 1, {mine});  // subgroup rank 1: parent rank 2 or 3
    EXPECT_TRUE(b.equal(at::full({3}, static_cast<float>(r % 2 == 0 ? 2 : 3))));
    at::Tensor whole = at::full({4}, static_cast<float>(r));
    all_reduce(whole);  // the parent still works in between
    EXPECT_TRUE(whole.equal(at::full({4}, 6.0f)));
    try {
      at::Tensor x = at::ones({1});
      all_reduce(x, ReduceOp::SUM, {other});
      ADD_FAILURE() << "a non-member's collective ran";
    } catch (const InvalidArgument& e) {
      const std::string name = r % 2 == 0 ? "subgroup 'odd' (parent ranks 1, 3)"
                                          : "subgroup 0 (parent ranks 0, 2)";
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r) +
                                           " of the parent group is not a member of " + name),
                std::string::npos)
          << e.what();
    }
  });
}

// split_group: disjoint subgroups at once; a rank in none gets null; a rank
// in two lists is refused on every rank before anything is exchanged.
TEST(Subgroup, SplitGroupGivesEachRankItsSubgroup) {
  run_ranks(5, [](int r) {
    ProcessGroupPtr mine = split_group({{3, 0}, {1, 4}}, {nullptr, std::nullopt, "pairs"});
    if (r == 2) {
      EXPECT_EQ(mine, nullptr);
    } else {
      ASSERT_NE(mine, nullptr);
      EXPECT_EQ(mine->size(), 2);
      EXPECT_EQ(mine->rank(), r == 0 || r == 1 ? 0 : 1);
      at::Tensor t = at::full({1000}, static_cast<float>(r));
      all_reduce(t, ReduceOp::SUM, {mine});
      EXPECT_TRUE(t.equal(at::full({1000}, r == 0 || r == 3 ? 3.0f : 5.0f))) << "rank " << r;
    }
    expect_error([&] { split_group({{0, 1}, {1, 2}}); },
                 "split_group: rank 1 is in split_ranks[0] and split_ranks[1]");
  });
}

TEST(Subgroup, ShardingAndPointToPointOnASubgroupOfASubgroup) {
  run_ranks(4, [](int r) {
    ProcessGroupPtr three = new_group({1, 2, 3});
    if (!is_member(*three)) {
      return;  // rank 0 is in neither: new_group on `three` is for its members
    }
    ProcessGroupPtr pair = new_group({0, 2}, {three});  // parent ranks 1 and 3
    at::Tensor out = at::empty({2});
    reduce_scatter_tensor(out, at::arange(6, at::kFloat) + r, ReduceOp::SUM, {three});
    const int64_t k = three->rank();
    // sum over parent ranks 1..3 of (arange + r), chunk k
    EXPECT_TRUE(out.equal((at::arange(6, at::kFloat).narrow(0, 2 * k, 2) * 3 + 6))) << r;
    if (is_member(*pair)) {
      at::Tensor t = at::full({5}, static_cast<double>(r), at::kDouble);
      if (pair->rank() == 0) {
        send(t, 1, 0, {pair});
      } else {
        recv(t, 0, 0, {pair});
        EXPECT_TRUE(t.equal(at::full({5}, 1.0, at::kDouble)));  // from parent rank 1
      }
    } else {
      EXPECT_EQ(r, 2);
    }
  });
}

TEST(Subgroup, BadRanksAreNamed) {
  run_ranks(2, [](int) {
    expect_error([] { new_group({}); }, "new_group: ranks is empty");
    expect_error([] { new_group({0, 2}); },
                 "new_group: rank 2 is not a rank of the parent group (size 2)");
    expect_error([] { new_group({1, 1}); }, "new_group: rank 1 is given twice");
  });
}

}  // namespace
}  // namespace ddp
