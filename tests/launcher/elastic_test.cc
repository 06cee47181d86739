// Elastic membership, --nnodes MIN:MAX (control.h, Note [Elastic rounds]):
// a round starts with MIN..MAX nodes, a lost node or a late node ends it and
// the next round runs on the nodes there are, without using up a restart.
// Launchers as real processes with identical command lines on this
// machine's loopback; the test worker's per-rank checkpoint stands in for a
// training checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ElasticTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    port_ = free_tcp_port();
  }

  // The same command line for every node of a --nnodes `range` job.
  std::vector<std::string> launcher(const std::string& range, const std::string& conf,
                                    std::vector<std::string> worker_args) const {
    std::vector<std::string> argv{DDPRUN_PATH, "--nnodes", range, "--nproc-per-node", "2",
                                  "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                  "127.0.0.1:" + std::to_string(port_), "--rdzv-conf",
                                  "keep_alive_interval=0.5,keep_alive_max_attempt=6," + conf,
                                  "--max-restarts", "0", TEST_WORKER_PATH};
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    return argv;
  }

  int port_ = 0;
};

TEST_F(ElasticTest, ARoundStartsWithTheNodesThatCameWithinTheLastCall) {
  const auto argv = launcher("1:3", "join_timeout=30,last_call_timeout=3", {"--print-env"});
  TestProcess host(argv, env());
  ASSERT_TRUE(host.wait_for_output("waiting on port", 20)) << host.output_so_far();
  TestProcess other(argv, env());
  auto h = host.wait(60);
  auto o = other.wait(60);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_THAT(h.err, HasSubstr("round 0: 2 node(s), world size 4"));
  EXPECT_THAT(h.out, HasSubstr("[rank0]:env WORLD_SIZE=4\n"));
  EXPECT_THAT(h.out, HasSubstr("[rank1]:env GROUP_WORLD_SIZE=2\n"));
  EXPECT_THAT(o.out, HasSubstr("[rank3]:env RANK=3\n"));
  EXPECT_THAT(o.out, HasSubstr("[rank2]:env GROUP_RANK=1\n"));
  // Rank 0's store is on a port of the round's own, not the rendezvous'.
  EXPECT_THAT(h.out, Not(HasSubstr("env MASTER_PORT=" + std::to_string(port_) + "\n")));
  expect_no_survivors();
}

TEST_F(ElasticTest, ALostNodeEndsTheRoundAndTheOthersResumeOnTheSmallerWorld) {
  const auto argv = launcher("1:2", "join_timeout=30,last_call_timeout=5",
                             {"--print-env", "--steps", "40", "--step-seconds", "0.1",
                              "--checkpoint", path("ckpt")});
  TestProcess host(argv, env());
  ASSERT_TRUE(host.wait_for_output("waiting on port", 20)) << host.output_so_far();
  TestProcess lost(argv, env());
  ASSERT_TRUE(host.wait_for_output("rank 0 step 5 restart 0", 30)) << host.output_so_far();
  lost.send_signal(SIGKILL);  // the whole node: launcher and workers
  auto h = host.wait(90);
  lost.wait(10);
  ASSERT_FALSE(h.timed_out);
  EXPECT_EQ(h.exit_code, 0) << h.err;
  EXPECT_THAT(h.err, HasSubstr("round 0: 2 node(s), world size 4"));
  EXPECT_THAT(h.err, HasSubstr("lost contact with node 1"));
  EXPECT_THAT(h.err, HasSubstr("round 1: 1 node(s), world size 2"));
  // The survivors resume from their checkpoints, with the restart count
  // untouched (--max-restarts 0 did not stop the new round).
  EXPECT_THAT(h.out, HasSubstr("[rank0]:rank 0 resumed from checkpoint at step"));
  EXPECT_THAT(h.out, HasSubstr("[rank0]:env WORLD_SIZE=2\n"));
  EXPECT_THAT(h.out, HasSubstr("[rank1]:rank 1 step 40 restart 0\n"));
  EXPECT_THAT(h.err, Not(HasSubstr("restarting the worker group")));
  expect_no_survivors();
}

TEST_F(ElasticTest, ALateNodeJoinsAtTheNextRound) {
  const auto argv = launcher("1:2", "join_timeout=30,last_call_timeout=0.5",
                             {"--print-env", "--steps", "40", "--step-seconds", "0.1",
                              "--checkpoint", path("ckpt")});
  TestProcess host(argv, env());
  ASSERT_TRUE(host.wait_for_output("rank 0 step 3 restart 0", 30)) << host.output_so_far();
  TestProcess late(argv, env());
  auto h = host.wait(90);
  auto l = late.wait(30);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_THAT(h.err, HasSubstr("round 0: 1 node(s), world size 2"));
  EXPECT_THAT(h.err, HasSubstr("joined the elastic job: the workers restart with 2 nodes"));
  EXPECT_THAT(h.err, HasSubstr("round 1: 2 node(s), world size 4"));
  EXPECT_THAT(h.out, HasSubstr("[rank0]:rank 0 resumed from checkpoint at step"));
  EXPECT_THAT(l.out, HasSubstr("[rank2]:env WORLD_SIZE=4\n"));
  EXPECT_THAT(l.out, HasSubstr("[rank3]:rank 3 step 40 restart 0\n"));
  expect_no_survivors();
}

// torchrun's c10d --nnodes 2 is 2:2: a node whose launcher gets SIGTERM
// says it leaves (node 0 blames it, not the ranks its leaving made fail), the
// other waits for a replacement, and a third node is refused at once.
TEST_F(ElasticTest, AFixedC10dJobReplacesANodeThatLeavesOnSigterm) {
  const auto argv = launcher("2", "join_timeout=60",
                             {"--print-env", "--steps", "40", "--step-seconds", "0.1",
                              "--checkpoint", path("ckpt")});
  TestProcess host(argv, env());
  ASSERT_TRUE(host.wait_for_output("waiting for 1 more node(s) on port", 20))
      << host.output_so_far();
  TestProcess leaving(argv, env());
  ASSERT_TRUE(host.wait_for_output("rank 0 step 5 restart 0", 30)) << host.output_so_far();
  leaving.send_signal(SIGTERM);
  auto l = leaving.wait(30);
  EXPECT_EQ(l.exit_code, 128 + SIGTERM) << l.err;
  EXPECT_THAT(l.err, Not(HasSubstr("lost contact")));
  ASSERT_TRUE(host.wait_for_output("waiting for 1 more node(s) on port", 30))
      << host.output_so_far();
  TestProcess replacement(argv, env());
  ASSERT_TRUE(host.wait_for_output("round 1: 2 node(s), world size 4", 30))
      << host.output_so_far();
  auto x = run(argv);  // a third node, during round 1
  EXPECT_EQ(x.exit_code, 1);
  EXPECT_THAT(x.err, HasSubstr("rejected this node: all 2 nodes of --nnodes 2 have joined "
                               "already"));
  auto h = host.wait(90);
  auto r = replacement.wait(30);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(h.err, HasSubstr("leaves the job: its launcher got SIGTERM"));
  EXPECT_THAT(h.err, HasSubstr("round 0 ended: node 1 ("));
  EXPECT_THAT(h.err, HasSubstr("the job goes on with its 2 node(s)"));
  EXPECT_THAT(h.err, Not(HasSubstr("Root cause")));
  EXPECT_THAT(h.out, HasSubstr("[rank0]:rank 0 resumed from checkpoint at step"));
  EXPECT_THAT(r.out, HasSubstr("[rank3]:rank 3 step 40 restart 0\n"));
  expect_no_survivors();
}

// A node paused past its heartbeats is dropped; when it goes on it reads
// why (node 0's last words on the link), not just a closed connection.
TEST_F(ElasticTest, ADroppedNodeLearnsWhy) {
  const auto argv = launcher("1:2", "join_timeout=30,last_call_timeout=5",
                             {"--steps", "60", "--step-seconds", "0.1"});
  TestProcess host(argv, env());
  ASSERT_TRUE(host.wait_for_output("waiting on port", 20)) << host.output_so_far();
  TestProcess paused(argv, env());
  ASSERT_TRUE(host.wait_for_output("rank 0 step 3 restart 0", 30)) << host.output_so_far();
  paused.send_signal(SIGSTOP);  // its launcher only; its workers go on
  ASSERT_TRUE(host.wait_for_output("round 1: 1 node(s)", 30)) << host.output_so_far();
  paused.send_signal(SIGCONT);
  auto p = paused.wait(60);
  auto h = host.wait(60);
  EXPECT_EQ(h.exit_code, 0) << h.err;
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_THAT(p.err, HasSubstr("lost contact with node 0 (127.0.0.1:" + std::to_string(port_) +
                               "): the other side closed the link: it heard nothing from this "
                               "side for"));
  expect_no_survivors();
}

TEST_F(ElasticTest, FewerThanMinNodesFailAfterTheJoinTimeout) {
  TestProcess host(launcher("2:3", "join_timeout=2", {"--print-env"}), env());
  auto h = host.wait(30);
  ASSERT_FALSE(h.timed_out);
  EXPECT_EQ(h.exit_code, 1);
  EXPECT_THAT(h.err, HasSubstr("only 1 node(s) of --nnodes 2:3 (at least 2) joined at port " +
                               std::to_string(port_) + " within join_timeout=2 s"));
  EXPECT_THAT(h.out, Not(HasSubstr("env RANK")));
}

TEST_F(ElasticTest, ANodeWithAnotherRangeIsRefused) {
  TestProcess host(launcher("1:2", "join_timeout=4,last_call_timeout=30", {"--print-env"}),
                   env());
  ASSERT_TRUE(host.wait_for_output("waiting on port", 20)) << host.output_so_far();
  auto o = run(launcher("1:3", "join_timeout=10,is_host=false", {"--print-env"}));
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_THAT(o.err, HasSubstr("--nnodes 1:3 differs from node 0's 1:2"));
  host.send_signal(SIGTERM);
  host.wait(30);
}

}  // namespace
}  // namespace ddp::testing
