// ddprun with real processes: a failing rank stops the job (worker_group.cc),
// the summary names the root cause (summary.cc), signals are forwarded and
// nothing outlives the launcher (signals.cc, spawn.cc, group_support.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(LauncherTest, RankExitCodeStopsTheJobAndIsNamed) {
  // Rank 1 exits 3 at step 2 of 3. Both ranks started helper processes,
  // which must go too.
  auto r = run(command({"--nproc-per-node", "2", "--grace-period", "5"},
                       {"--steps", "3", "--step-seconds", "0.2", "--fail-rank", "1",
                        "--fail-step", "2", "--exit-code", "3", "--helpers"}));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("Root cause (first observed failure): rank 1 (local_rank 1) "
                               "on node 0"));
  EXPECT_THAT(r.err, HasSubstr("failed: exit code 3"));
  EXPECT_THAT(r.err, HasSubstr("    | rank 1 failing at step 2"));  // its stderr
  EXPECT_THAT(r.out, HasSubstr("[rank1]:rank 1 step 1 restart 0"));
  EXPECT_THAT(r.out, Not(HasSubstr("rank 1 step 2")));
  expect_no_survivors();
}

TEST_F(LauncherTest, OtherRanksAreStoppedAndListed) {
  auto r = run(command({"--nproc-per-node", "3"},
                       {"--steps", "600", "--step-seconds", "0.1", "--fail-rank", "2",
                        "--fail-step", "2", "--exit-code", "9"}));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rank 2 (local_rank 2) on node 0"));
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local_rank 0): stopped by ddprun (signal SIGTERM (15))"));
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local_rank 1): stopped by ddprun (signal SIGTERM (15))"));
  expect_no_survivors();
}

TEST_F(LauncherTest, ARankDyingOfItsOwnSignalWhileStoppedIsReportedWithIt) {
  // Rank 1 fails; rank 0 aborts (SIGABRT) when ddprun's SIGTERM arrives.
  auto r = run(command({"--nproc-per-node", "2"},
                       {"--steps", "600", "--step-seconds", "0.1", "--fail-rank", "1",
                        "--fail-step", "2", "--exit-code", "4", "--abort-on-stop"}));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local_rank 1) on node 0"));
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local_rank 0): failed too (signal SIGABRT (6))"));
  EXPECT_THAT(r.err, Not(HasSubstr("stopped by ddprun (signal SIGABRT")));
  expect_no_survivors();
}

class SignalNameTest : public LauncherTest, public ::testing::WithParamInterface<int> {};

TEST_P(SignalNameTest, SignalOfTheFailedRankIsNamed) {
  const int sig = GetParam();
  auto r = run(command({"--nproc-per-node", "2"},
                       {"--steps", "600", "--step-seconds", "0.1", "--fail-rank", "1",
                        "--fail-step", "1", "--signal", std::to_string(sig)}));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  const std::string name = sig == SIGKILL ? "SIGKILL" : sig == SIGSEGV ? "SIGSEGV" : "SIGABRT";
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local_rank 1) on node 0"));
  EXPECT_THAT(r.err, HasSubstr("failed: signal " + name + " (" + std::to_string(sig) + ")"));
  expect_no_survivors();
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalNameTest, ::testing::Values(SIGKILL, SIGSEGV, SIGABRT));

TEST_F(LauncherTest, ErrorFileMessageIsInTheSummary) {
  auto r = run(command({"--nproc-per-node", "2"},
                       {"--fail-rank", "0", "--error-message", "ValueError: bad batch"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local_rank 0) on node 0"));
  EXPECT_THAT(r.err, HasSubstr("/attempt_0/0/error.json"));
  EXPECT_THAT(r.err, HasSubstr("    ValueError: bad batch\n    frame one\n    frame two"));
}

TEST_F(LauncherTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  auto r = run(command({"--nproc-per-node", "2", "--grace-period", "1"},
                       {"--ignore-stop", "--steps", "600", "--step-seconds", "0.1",
                        "--fail-rank", "1", "--fail-step", "2"}));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local_rank 0): stopped by ddprun (signal SIGKILL (9))"));
  expect_no_survivors();
}

TEST_F(LauncherTest, SigtermIsForwardedAndNothingSurvives) {
  // Workers start helpers, one in its own session (out of the worker's
  // process group): they must not outlive the job either.
  TestProcess p(command({"--nproc-per-node", "2"},
                        {"--helpers", "--ready", path("up"), "--steps", "600",
                         "--step-seconds", "0.1"}),
                env());
  ASSERT_TRUE(wait_for_file(path("up.0"), 30) && wait_for_file(path("up.1"), 30));
  ASSERT_TRUE(p.wait_for_output("rank 1 step 1", 30));
  p.send_signal(SIGTERM);
  auto r = p.wait(30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_THAT(r.err, HasSubstr("got SIGTERM: passing it to every worker"));
  EXPECT_THAT(r.err, Not(HasSubstr("Root cause")));  // a stop, not a failure
  expect_no_survivors();
}

TEST_F(LauncherTest, SecondSigintKillsAtOnce) {
  // The workers ignore SIGINT and the grace period is longer than the test's
  // bound: only an immediate SIGKILL lets ddprun end in time.
  TestProcess p(command({"--nproc-per-node", "2", "--grace-period", "600"},
                        {"--ignore-stop", "--ready", path("up"), "--steps", "6000",
                         "--step-seconds", "0.1"}),
                env());
  ASSERT_TRUE(wait_for_file(path("up.0"), 30) && wait_for_file(path("up.1"), 30));
  p.send_signal(SIGINT);
  ASSERT_TRUE(p.wait_for_output("got SIGINT", 30));
  p.send_signal(SIGINT);
  auto r = p.wait(60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  EXPECT_THAT(r.err, HasSubstr("SIGINT again: killing every worker now"));
  expect_no_survivors();
}

TEST_F(LauncherTest, WorkersDieWhenTheLauncherIsKilled) {
  TestProcess p(command({"--nproc-per-node", "2"},
                        {"--ready", path("up"), "--steps", "6000", "--step-seconds", "0.1"}),
                env());
  ASSERT_TRUE(wait_for_file(path("up.0"), 30) && wait_for_file(path("up.1"), 30));
  p.send_signal(SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must
  auto r = p.wait(30);
  EXPECT_EQ(r.signal, SIGKILL);
  expect_no_survivors();
}

TEST_F(LauncherTest, SuccessfulJobExitsZero) {
  auto r = run(command({"--nproc-per-node", "2"}, {"--steps", "2"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    for (int step = 1; step <= 2; ++step) {
      EXPECT_THAT(r.out, HasSubstr("[rank" + std::to_string(rank) + "]:rank " +
                                   std::to_string(rank) + " step " + std::to_string(step)));
    }
  }
  EXPECT_THAT(r.err, Not(HasSubstr("Root cause")));
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::testing
