// The failure summary (summary.cc) and the torchelastic error file formats.
#include "launcher/summary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>

#include "support/temp_dir.h"

namespace ddp::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LauncherSummary, DescribesExitCodesAndSignals) {
  EXPECT_EQ(describe_end(3, 0), "exit code 3");
  EXPECT_EQ(describe_end(-1, SIGKILL), "signal SIGKILL (9)");
  EXPECT_EQ(describe_end(-1, SIGSEGV), "signal SIGSEGV (11)");
}

TEST(LauncherSummary, ReadsBothErrorFileFormats) {
  testing::TempDir dir;
  std::ofstream(dir.file("a.json"))
      << R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1"}}})";
  std::ofstream(dir.file("b.json")) << R"({"message": "plain text", "timestamp": 5})";
  std::ofstream(dir.file("c.json")) << "not json";
  EXPECT_EQ(read_error_message(dir.file("a.json")), "RuntimeError: boom\nTraceback...");
  EXPECT_EQ(read_error_message(dir.file("b.json")), "plain text");
  EXPECT_THAT(read_error_message(dir.file("c.json")), HasSubstr("could not read the error file"));
}

TEST(LauncherSummary, RootCauseFirstThenTheOthers) {
  WorkerResult w0, w1;
  w0.rank = 4;
  w0.local_rank = 0;
  w0.pid = 100;
  w0.end = WorkerEnd::kStopped;
  w0.signal = SIGTERM;
  w1.rank = 5;
  w1.local_rank = 1;
  w1.pid = 101;
  w1.end = WorkerEnd::kFailed;
  w1.exit_code = 3;
  w1.stderr_tail = {"Traceback", "ValueError: x"};
  FailureReport root = make_failure_report(w1, 2);
  std::string s = format_summary("prog failed", root, {w0, w1}, {"node 1: stopped"});
  EXPECT_THAT(s, HasSubstr("ddprun: prog failed\nRoot cause (first observed failure): rank 5 "
                           "(local_rank 1) on node 2 ("));
  EXPECT_THAT(s, HasSubstr("failed: exit code 3\n"));
  EXPECT_THAT(s, HasSubstr("    | Traceback\n    | ValueError: x\n"));
  EXPECT_THAT(s, HasSubstr("Other ranks:\n  rank 4 (local_rank 0): stopped by ddprun "
                           "(signal SIGTERM (15))\n  node 1: stopped\n"));
  EXPECT_THAT(s, Not(HasSubstr("  rank 5 (local_rank 1):")));  // not listed twice
}

// Note [Root cause]: rank 1 lost its peer and exited first; rank 0 recorded
// its error earlier and was stopped by ddprun before it exited. Rank 0 is the
// root cause, rank 1 is listed as a consequence.
TEST(LauncherSummary, RootCauseIsTheFirstFailureInTimeNotTheFirstExit) {
  testing::TempDir dir;
  std::ofstream(dir.file("0.json")) << R"({"message": {"message": "ddp::InvalidArgument: bad",
      "extraInfo": {"timestamp": "1", "ddp_timestamp_us": "1000000500000", "ddp_lost_peer": "0"}}})";
  std::ofstream(dir.file("1.json")) << R"({"message": {"message": "ddp::CommError: closed",
      "extraInfo": {"timestamp": "1", "ddp_timestamp_us": "1000000600000", "ddp_lost_peer": "1"}}})";
  std::vector<WorkerResult> w(3);
  for (int i = 0; i < 3; ++i) {
    w[i].rank = w[i].local_rank = i;
    w[i].end_time = 1000000.0 + i;
  }
  w[0].end = WorkerEnd::kStopped;
  w[0].signal = SIGTERM;
  w[0].end_time = 1000002.0;  // stopped last
  w[0].error_file = dir.file("0.json");
  w[1].end = WorkerEnd::kFailed;
  w[1].exit_code = 4;
  w[1].end_time = 1000000.7;  // reaped first
  w[1].error_file = dir.file("1.json");
  w[2].end = WorkerEnd::kStopped;
  w[2].signal = SIGTERM;
  for (auto& x : w) read_error_facts(x);
  EXPECT_DOUBLE_EQ(w[0].error_time, 1000000.5);
  EXPECT_TRUE(w[1].lost_peer);
  EXPECT_EQ(pick_root_cause(w, 1), 0);
  const std::string s = format_summary("prog failed", make_failure_report(w[0], 0), w, {});
  EXPECT_THAT(s, HasSubstr("failed: it recorded its error first, then ended (signal SIGTERM (15)) "
                           "while ddprun stopped the group"));
  EXPECT_THAT(s, HasSubstr("  rank 1 (local_rank 1): failed too (exit code 4), a consequence: it "
                           "lost its connection to a failed rank\n"));
  EXPECT_THAT(s, HasSubstr("  rank 2 (local_rank 2): stopped by ddprun (signal SIGTERM (15))\n"));
  // Without error files the first failure seen stays the root cause; a
  // worker that did not lose a peer comes before one that did.
  std::vector<WorkerResult> plain(2);
  plain[0].end = plain[1].end = WorkerEnd::kFailed;
  plain[0].end_time = 5;
  plain[1].end_time = 4;
  EXPECT_EQ(pick_root_cause(plain, 0), 1);
  plain[1].lost_peer = true;
  EXPECT_EQ(pick_root_cause(plain, 1), 0);
}

}  // namespace
}  // namespace ddp::launcher
