// Two ddprun launchers as two nodes on this machine's loopback (control.h,
// coordinator.cc, agent.cc): one world, a failure on one node stops the
// other, restarts restart both, mismatched flags are refused, a vanished
// launcher is noticed. Real processes; no root needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;

class MultiNodeTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    port_ = free_tcp_port();
  }

  // ddprun on node `node` of 2, with `flags`, running `program`.
  std::vector<std::string> node(int node, std::vector<std::string> flags,
                                const std::vector<std::string>& program) const {
    std::vector<std::string> argv{DDPRUN_PATH, "--nnodes", "2", "--node-rank",
                                  std::to_string(node), "--master-addr", "127.0.0.1",
                                  "--master-port", std::to_string(port_), "--rdzv-conf",
                                  "join_timeout=60,keep_alive_interval=0.5,keep_alive_max_attempt=6"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }

  std::vector<std::string> worker(std::vector<std::string> args) const {
    args.insert(args.begin(), TEST_WORKER_PATH);
    return args;
  }

  int port_ = 0;
};

TEST_F(MultiNodeTest, TwoNodesFormOneWorld) {
  TestProcess n1(node(1, {"--nproc-per-node", "2"}, worker({"--print-env"})), env());
  TestProcess n0(node(0, {"--nproc-per-node", "2"}, worker({"--print-env"})), env());
  auto r0 = n0.wait(60);
  auto r1 = n1.wait(60);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  for (int rank = 0; rank < 4; ++rank) {
    const ProcessResult& r = rank < 2 ? r0 : r1;
    const std::string p = "[rank" + std::to_string(rank) + "]:env ";
    EXPECT_THAT(r.out, HasSubstr(p + "RANK=" + std::to_string(rank) + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "LOCAL_RANK=" + std::to_string(rank % 2) + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "GROUP_RANK=" + std::to_string(rank / 2) + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "WORLD_SIZE=4\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "MASTER_PORT=" + std::to_string(port_) + "\n"));
  }
  EXPECT_THAT(r0.err, HasSubstr("node 1 ("));  // "node 1 (<host>) joined"
  expect_no_survivors();
}

TEST_F(MultiNodeTest, NodesMayFinishAtDifferentTimes) {
  // Node 1's ranks run several heartbeat timeouts longer than node 0's: node
  // 0 waits for them as long as node 1 answers.
  auto args = worker({"--steps", "1", "--long-from-rank", "2", "--long-steps", "45",
                      "--step-seconds", "0.1"});
  TestProcess n0(node(0, {"--nproc-per-node", "2"}, args), env());
  TestProcess n1(node(1, {"--nproc-per-node", "2"}, args), env());
  auto r0 = n0.wait(120);
  auto r1 = n1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_THAT(r1.out, HasSubstr("[rank3]:rank 3 step 45 restart 0"));
}

TEST_F(MultiNodeTest, FailureOnNodeOneStopsNodeZero) {
  auto args = worker({"--steps", "600", "--step-seconds", "0.1", "--fail-rank", "3",
                      "--fail-step", "2", "--exit-code", "7"});
  TestProcess n0(node(0, {"--nproc-per-node", "2"}, args), env());
  TestProcess n1(node(1, {"--nproc-per-node", "2"}, args), env());
  auto r0 = n0.wait(60);
  auto r1 = n1.wait(60);
  ASSERT_FALSE(r0.timed_out || r1.timed_out);
  EXPECT_EQ(r0.exit_code, 1);
  EXPECT_EQ(r1.exit_code, 1);
  for (const auto* r : {&r0, &r1}) {
    EXPECT_THAT(r->err, HasSubstr("Root cause (first observed failure): rank 3 (local_rank 1) "
                                  "on node 1"));
    EXPECT_THAT(r->err, HasSubstr("failed: exit code 7"));
  }
  EXPECT_THAT(r0.err, HasSubstr("rank 0 (local_rank 0): stopped by ddprun"));
  EXPECT_THAT(r0.err, HasSubstr("node 1: failed"));
  EXPECT_THAT(r1.err, HasSubstr("rank 2 (local_rank 0): stopped by ddprun"));
  expect_no_survivors();
}

TEST_F(MultiNodeTest, RestartRestartsEveryNode) {
  auto args = worker({"--steps", "2", "--step-seconds", "0.2", "--fail-rank", "2",
                      "--fail-step", "2", "--fail-once", path("marker")});
  TestProcess n0(node(0, {"--nproc-per-node", "2", "--max-restarts", "1"}, args), env());
  TestProcess n1(node(1, {"--nproc-per-node", "2", "--max-restarts", "1"}, args), env());
  auto r0 = n0.wait(90);
  auto r1 = n1.wait(90);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_THAT(r0.err, HasSubstr("restarting the worker group (restart 1 of 1)"));
  EXPECT_THAT(r0.out, HasSubstr("[rank0]:rank 0 step 2 restart 1"));
  EXPECT_THAT(r1.out, HasSubstr("[rank2]:rank 2 step 2 restart 1"));
  EXPECT_THAT(r1.out, HasSubstr("[rank3]:rank 3 step 2 restart 1"));
  expect_no_survivors();
}

TEST_F(MultiNodeTest, MismatchedNprocIsRefused) {
  TestProcess n0(node(0, {"--nproc-per-node", "2", "--rdzv-conf", "join_timeout=3"},
                      worker({})),
                 env());
  TestProcess n1(node(1, {"--nproc-per-node", "3"}, worker({})), env());
  auto r1 = n1.wait(60);
  auto r0 = n0.wait(60);
  EXPECT_EQ(r1.exit_code, 1);
  EXPECT_THAT(r1.err, HasSubstr("rejected node 1: --nproc-per-node 3 differs from node 0's 2"));
  EXPECT_EQ(r0.exit_code, 1);
  EXPECT_THAT(r0.err, HasSubstr("only 1 of 2 nodes joined at port " + std::to_string(port_)));
  EXPECT_THAT(r0.err, HasSubstr("missing node ranks: 1"));
}

TEST_F(MultiNodeTest, KilledLauncherIsNoticedByTheOtherNode) {
  auto args = worker({"--ready", path("up"), "--steps", "6000", "--step-seconds", "0.1"});
  TestProcess n0(node(0, {"--nproc-per-node", "1"}, args), env());
  TestProcess n1(node(1, {"--nproc-per-node", "1"}, args), env());
  ASSERT_TRUE(wait_for_file(path("up.0"), 60) && wait_for_file(path("up.1"), 60));
  n1.send_signal(SIGKILL);
  auto r0 = n0.wait(60);
  ASSERT_FALSE(r0.timed_out);
  EXPECT_EQ(r0.exit_code, 1);
  EXPECT_THAT(r0.err, HasSubstr("lost contact with node 1"));
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::testing
