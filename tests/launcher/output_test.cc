// ddprun's output relay with real processes (relay.cc, group_support.cc):
// [rankN]: prefixes on whole lines, the console filter, log files per rank
// per restart, --redirects and --tee.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The one entry of a directory (the run directory ddprun made in a log dir).
std::string only_entry(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(d);
  }
  EXPECT_EQ(names.size(), 1u) << dir;
  return names.empty() ? "" : dir + "/" + names[0];
}

TEST_F(LauncherTest, PrefixedLinesOfThreeRanksNeverMix) {
  const int kLines = 2000;
  auto r = run(command({"--nproc-per-node", "3"},
                       {"--lines", std::to_string(kLines), "--width", "300"}));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex out_line(R"(\[rank(\d)\]:line \d+ of rank (\d) x{300})");
  const std::regex err_line(R"(\[rank(\d)\]:err \d+ of rank (\d))");
  int out_count[3] = {0, 0, 0}, err_count[3] = {0, 0, 0};
  std::istringstream out(r.out), err(r.err);
  std::smatch m;
  for (std::string line; std::getline(out, line);) {
    if (line.find("step") != std::string::npos) continue;
    ASSERT_TRUE(std::regex_match(line, m, out_line)) << line.substr(0, 200);
    ASSERT_EQ(m[1], m[2]) << "prefix and content disagree: " << line.substr(0, 200);
    ++out_count[std::stoi(m[1])];
  }
  for (std::string line; std::getline(err, line);) {
    if (line.rfind("ddprun: ", 0) == 0) continue;
    ASSERT_TRUE(std::regex_match(line, m, err_line)) << line;
    ASSERT_EQ(m[1], m[2]) << line;
    ++err_count[std::stoi(m[1])];
  }
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(out_count[rank], kLines) << "rank " << rank;
    EXPECT_EQ(err_count[rank], kLines) << "rank " << rank;
  }
}

TEST_F(LauncherTest, OneRankOnTheConsoleHasNoPrefix) {
  auto r = run(command({"--nproc-per-node", "1"}, {"--lines", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("line 0 of rank 0 \nline 1 of rank 0 \n"));
  EXPECT_THAT(r.out, Not(HasSubstr("[rank")));
}

TEST_F(LauncherTest, LocalRanksFilterShowsOnlyThoseRanks) {
  auto r = run(command({"--nproc-per-node", "2", "--local-ranks-filter", "1"},
                       {"--lines", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("line 0 of rank 1"));
  EXPECT_THAT(r.out, Not(HasSubstr("of rank 0")));
  EXPECT_THAT(r.err, Not(HasSubstr("of rank 0")));
  EXPECT_THAT(r.out, Not(HasSubstr("[rank")));  // a single rank shown
}

TEST_F(LauncherTest, LogDirKeepsOneFilePerRankPerRestart) {
  auto r = run(command({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                        path("logs")},
                       {"--steps", "1", "--fail-rank", "0", "--fail-once", path("marker")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run_dir = only_entry(path("logs"));
  EXPECT_THAT(run_dir, HasSubstr("/none_"));  // <run id>_<unique>
  EXPECT_THAT(r.err, HasSubstr("log files of every rank in " + run_dir));
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      std::string d = run_dir + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(rank);
      EXPECT_TRUE(wait_for_file(d + "/stdout.log", 0) && wait_for_file(d + "/stderr.log", 0)) << d;
    }
  }
  // Attempt 0: rank 0 failed at once (rank 1 was stopped, maybe before it
  // wrote anything); attempt 1: both ran their step. No prefixes in files.
  EXPECT_EQ(read_text(run_dir + "/attempt_0/0/stderr.log"), "rank 0 failing at step 1\n");
  EXPECT_EQ(read_text(run_dir + "/attempt_0/0/stdout.log"), "");
  EXPECT_EQ(read_text(run_dir + "/attempt_1/0/stdout.log"), "rank 0 step 1 restart 1\n");
  EXPECT_EQ(read_text(run_dir + "/attempt_1/1/stdout.log"), "rank 1 step 1 restart 1\n");
  EXPECT_EQ(read_text(run_dir + "/attempt_1/1/stderr.log"), "");
  // Without -r the console shows the lines too.
  EXPECT_THAT(r.out, HasSubstr("[rank1]:rank 1 step 1 restart 1"));
}

TEST_F(LauncherTest, RedirectsSendStreamsToFilesOnly) {
  // Rank 0's stdout goes to its file only; everything else to the console.
  auto r = run(command({"--nproc-per-node", "2", "-r", "0:1", "--log-dir", path("logs")},
                       {"--lines", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run_dir = only_entry(path("logs"));
  EXPECT_THAT(r.out, Not(HasSubstr("of rank 0")));
  EXPECT_THAT(r.out, HasSubstr("[rank1]:line 0 of rank 1"));
  EXPECT_THAT(r.err, HasSubstr("[rank0]:err 0 of rank 0"));
  EXPECT_THAT(read_text(run_dir + "/attempt_0/0/stdout.log"), HasSubstr("line 0 of rank 0"));
}

TEST_F(LauncherTest, TeeWithoutLogDirKeepsFilesInATemporaryDirectory) {
  auto r = run(command({"--nproc-per-node", "2", "--tee", "3"}, {"--lines", "1"}),
               {"TMPDIR=" + dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_with(r.err, "log files of every rank in ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  const std::string run_dir = lines[0].substr(lines[0].find(" in ") + 4);
  EXPECT_THAT(run_dir, HasSubstr(dir_ + "/ddprun_none_"));
  EXPECT_THAT(read_text(run_dir + "/attempt_0/1/stdout.log"), HasSubstr("line 0 of rank 1"));
  EXPECT_THAT(read_text(run_dir + "/attempt_0/1/stderr.log"), HasSubstr("err 0 of rank 1"));
  EXPECT_THAT(r.out, HasSubstr("[rank1]:line 0 of rank 1"));
}

TEST_F(LauncherTest, NoLogsLeaveNoDirectory) {
  auto r = run(command({"--nproc-per-node", "2"}, {"--steps", "1"}), {"TMPDIR=" + dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  DIR* d = opendir(dir_.c_str());
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 0);  // the error-file directory was removed
}

// The run directory names of `dir` ("ddprun_..."), sorted.
std::vector<std::string> run_dirs_in(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = d ? readdir(d) : nullptr) {
    if (std::string(e->d_name).rfind("ddprun_", 0) == 0) names.push_back(e->d_name);
  }
  if (d) closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// A ddprun killed with SIGKILL leaves its run directory; the next ddprun of
// the user removes it (its owner is gone) but not a directory it cannot
// judge (no owner file).
TEST_F(LauncherTest, ARunDirectoryLeftByAKilledLauncherIsRemovedByTheNext) {
  const std::string tmp = path("tmp");
  ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0);
  auto e = env();
  e.push_back("TMPDIR=" + tmp);
  {
    TestProcess p(command({"--nproc-per-node", "2"},
                          {"--ready", path("up"), "--steps", "6000", "--step-seconds", "0.1"}),
                  e);
    ASSERT_TRUE(wait_for_file(path("up.0"), 30) && wait_for_file(path("up.1"), 30));
    p.send_signal(SIGKILL);
    EXPECT_EQ(p.wait(30).signal, SIGKILL);
  }
  expect_no_survivors();
  const auto left = run_dirs_in(tmp);
  ASSERT_EQ(left.size(), 1u) << "the killed launcher's directory";
  ASSERT_EQ(::mkdir((tmp + "/ddprun_foreign_x").c_str(), 0700), 0);
  auto r = run(command({"--nproc-per-node", "2"}, {"--steps", "1"}), {"TMPDIR=" + tmp});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(run_dirs_in(tmp), std::vector<std::string>{"ddprun_foreign_x"}) << left[0];
}

}  // namespace
}  // namespace ddp::testing
