// The failure summary (summary.cc) and the torchelastic error file formats.
#include "launcher/summary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>

#include "launcher/process_harness.h"

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
  std::string dir = testing::make_temp_dir();
  std::ofstream(dir + "/a.json")
      << R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1"}}})";
  std::ofstream(dir + "/b.json") << R"({"message": "plain text", "timestamp": 5})";
  std::ofstream(dir + "/c.json") << "not json";
  EXPECT_EQ(read_error_message(dir + "/a.json"), "RuntimeError: boom\nTraceback...");
  EXPECT_EQ(read_error_message(dir + "/b.json"), "plain text");
  EXPECT_THAT(read_error_message(dir + "/c.json"), HasSubstr("could not read the error file"));
  testing::remove_tree(dir);
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

}  // namespace
}  // namespace ddp::launcher
