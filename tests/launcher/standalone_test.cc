// ddprun --standalone (launcher.cc, worker_env.cc, rendezvous.cc): ddp
// programs meet in a file of the launcher's private run directory
// (DDP_RENDEZVOUS_FILE) and Gloo binds the loopback, so the job listens on
// no network interface. Real processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(LauncherTest, StandaloneJobListensOnTheLoopbackOnly) {
  auto r = run({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", ALLREDUCE_WORKER_PATH, "2",
                "0.01"},
               {"ALLREDUCE_WORKER_PRINT_LISTENING=1"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]:";
    EXPECT_THAT(r.out, HasSubstr(p + "rank " + std::to_string(rank) + " world 2 step 2 sum 3"));
  }
  // Nothing listens beyond the loopback: a TCP store would, on every
  // interface. (Gloo's listener closes once its pairs are connected in
  // libtorch 1.13; 2.13's Gloo keeps it, on the loopback.)
  EXPECT_THAT(r.out, Not(HasSubstr("listening NOT-LOOPBACK"))) << r.out;
  expect_no_survivors();
}

TEST_F(LauncherTest, ListeningProbeSeesTheStoreOfAJobThatIsNotStandalone) {
  // The control for the test above: with a master port, rank 0 hosts a TCP
  // store that other nodes must reach, so it listens beyond the loopback.
  auto r = run({DDPRUN_PATH, "--nproc-per-node", "2", "--master-port",
                std::to_string(free_tcp_port()), ALLREDUCE_WORKER_PATH, "1", "0.01"},
               {"ALLREDUCE_WORKER_PRINT_LISTENING=1"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank0]:listening NOT-LOOPBACK")) << r.out;
  expect_no_survivors();
}

TEST_F(LauncherTest, StandaloneRendezvousFileIsNotInheritedByAnotherLauncher) {
  // An outer launcher's file must not leak into a non-standalone job.
  const int port = free_tcp_port();
  auto r = run({DDPRUN_PATH, "--nproc-per-node", "1", "--master-port", std::to_string(port),
                TEST_WORKER_PATH, "--print-env"},
               {"DDP_RENDEZVOUS_FILE=/nonexistent/outer.store"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("env DDP_RENDEZVOUS_FILE=<unset>\n"));
}

TEST_F(LauncherTest, StandaloneGivesEachAttemptItsOwnRendezvousFile) {
  auto r = run({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", TEST_WORKER_PATH,
                "--print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_with(r.out, "env DDP_RENDEZVOUS_FILE=");
  ASSERT_EQ(lines.size(), 2u) << r.out;
  const std::string file = lines[0].substr(lines[0].find('=') + 1);
  EXPECT_THAT(file, ::testing::EndsWith("/rendezvous.store"));
  EXPECT_EQ(lines[1].substr(lines[1].find('=') + 1), file);  // both ranks: one file
}

}  // namespace
}  // namespace ddp::testing
