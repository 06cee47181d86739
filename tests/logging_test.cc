// Rank-0 printing and rank-prefixed logging, with ranks as threads: what each
// function writes (captured stdout/stderr), level filtering, DDP_LOG_LEVEL,
// and whole lines under concurrent writers.
#include "ddp/logging.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <vector>

#include "ddp/error.h"
#include "log_level.h"
#include "support/scoped_env.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::run_ranks;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Restores the process-wide threshold after each test.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = log_level(); }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::kInfo;
};

TEST_F(LoggingTest, Print0WritesOnRankZeroOnly) {
  ::testing::internal::CaptureStdout();
  run_ranks(3, [](int r) {
    print0("epoch 1 from rank " + std::to_string(r));
    print0f("loss %.3f on rank %d", 0.25, r);
  });
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "epoch 1 from rank 0\nloss 0.250 on rank 0\n");
}

TEST_F(LoggingTest, WithoutAProcessGroupTheCallerIsRankZero) {
  ::testing::internal::CaptureStdout();
  print0("single\nprocess\n");
  print_all("all");
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "single\nprocess\n[rank0]: all\n");
}

// Before init_process_group, a process started with RANK=1 is rank 1 in
// its messages (and not rank 0 for print0).
TEST_F(LoggingTest, WithoutAProcessGroupTheLaunchEnvironmentsRankCounts) {
  testing::ScopedEnv rank("RANK", "1");
  testing::ScopedEnv world("WORLD_SIZE", "2");
  ::testing::internal::CaptureStdout();
  print0("not shown");
  print_all("all");
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "[rank1]: all\n");
}

TEST_F(LoggingTest, PrintAllPrefixesEveryLineWithTheRank) {
  ::testing::internal::CaptureStdout();
  run_ranks(2, [](int r) { print_all("a\nb" + std::to_string(r)); });
  std::vector<std::string> lines = lines_of(::testing::internal::GetCapturedStdout());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank0]: a", "[rank0]: b0",
                                             "[rank1]: a", "[rank1]: b1"}));
}

TEST_F(LoggingTest, LogFiltersByLevelAndPrefixesTheRank) {
  set_log_level(LogLevel::kWarning);
  ::testing::internal::CaptureStderr();
  run_ranks(2, [](int r) {
    log(LogLevel::kInfo, "dropped");
    log(LogLevel::kDebug, "dropped");
    if (r == 1) log(LogLevel::kWarning, "shard is empty");
    if (r == 1) logf(LogLevel::kError, "code %d", 7);
    log0(LogLevel::kError, "job failed");
    log0(LogLevel::kInfo, "dropped");
  });
  std::vector<std::string> lines = lines_of(::testing::internal::GetCapturedStderr());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"ERROR: job failed",
                                             "[rank1]: ERROR: code 7",
                                             "[rank1]: WARNING: shard is empty"}));
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  set_log_level(LogLevel::kOff);
  EXPECT_FALSE(log_enabled(LogLevel::kError));
  EXPECT_FALSE(log_enabled(LogLevel::kOff));
}

TEST_F(LoggingTest, DebugLevelShowsEverything) {
  set_log_level(LogLevel::kDebug);
  ::testing::internal::CaptureStderr();
  log(LogLevel::kDebug, "bucket 3 ready");
  log0f(LogLevel::kInfo, "%s=%d", "world_size", 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "[rank0]: DEBUG: bucket 3 ready\nINFO: world_size=1\n");
}

TEST_F(LoggingTest, ConcurrentWritersNeverSplitALine) {
  const int world = 4, per_rank = 300;
  const std::string payload(200, 'x');
  ::testing::internal::CaptureStdout();
  run_ranks(world, [&](int) {
    for (int i = 0; i < per_rank; ++i) print_all("line " + std::to_string(i) + " " + payload);
  });
  std::vector<std::string> lines = lines_of(::testing::internal::GetCapturedStdout());
  ASSERT_EQ(lines.size(), static_cast<size_t>(world * per_rank));
  const std::regex whole("\\[rank[0-3]\\]: line [0-9]+ x{200}");
  for (const std::string& line : lines) {
    ASSERT_TRUE(std::regex_match(line, whole)) << line;
  }
}

TEST(LogLevel, ParsesNamesAndNumbers) {
  EXPECT_EQ(detail::parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(detail::parse_log_level("INFO"), LogLevel::kInfo);
  EXPECT_EQ(detail::parse_log_level("Warn"), LogLevel::kWarning);
  EXPECT_EQ(detail::parse_log_level("warning"), LogLevel::kWarning);
  EXPECT_EQ(detail::parse_log_level("40"), LogLevel::kError);
  EXPECT_EQ(detail::parse_log_level("off"), LogLevel::kOff);
  EXPECT_STREQ(to_string(LogLevel::kWarning), "WARNING");
  try {
    detail::parse_log_level("loud", "--log-level");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "--log-level='loud' is not a log level: use one of debug, "
                 "info, warning, error, off (or 10, 20, 30, 40)");
  }
}

// The threshold is read from DDP_LOG_LEVEL once per process: death tests
// re-run this binary, so each check gets a fresh process.
TEST(LogLevelEnv, DdpLogLevelSetsTheThreshold) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  {
    testing::ScopedEnv level("DDP_LOG_LEVEL", "error");
    EXPECT_EXIT(std::exit(log_level() == LogLevel::kError ? 0 : 1),
                ::testing::ExitedWithCode(0), "");
  }
  testing::ScopedEnv level("DDP_LOG_LEVEL", "bogus");
  EXPECT_EXIT(std::exit(log_level() == LogLevel::kInfo ? 0 : 1),
              ::testing::ExitedWithCode(0),
              "ddp: DDP_LOG_LEVEL='bogus' is not a log level: .*; using info");
}

}  // namespace
}  // namespace ddp
