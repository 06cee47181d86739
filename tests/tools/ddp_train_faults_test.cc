// Failures of a real 2-rank training through ddprun (ddp-train --fault):
// a rank crashing inside backward, killed by SIGKILL, stopped by SIGSTOP.
// The launcher must exit non-zero within a bound, name the failed rank, and
// leave nothing running; with --max-restarts the run that lost a rank
// finishes with exactly the parameters of an uninterrupted run.
#include <gtest/gtest.h>

#include <fstream>

#include "ddp/checkpoint.h"
#include "launcher/process_harness.h"

namespace ddp::testing {
namespace {

bool have_data() {
  return std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good();
}

class DdpTrainFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    dir_ = make_temp_dir();
    tag_ = unique_tag();
  }
  void TearDown() override {
    kill_processes_with_tag(tag_);
    if (!dir_.empty()) remove_tree(dir_);
  }
  // 2 ranks, 1280 training images: 10 steps of 2 x 64 per epoch.
  ProcessResult train(const std::string& out, std::vector<std::string> extra,
                      std::vector<std::string> launcher_flags = {}) {
    std::vector<std::string> argv = {DDPRUN_PATH, "--standalone", "--nproc-per-node", "2",
                                     "--grace-period", "2"};
    argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
    for (const char* a : {DDP_TRAIN_PATH, "--train-samples", "1280", "--test-samples", "200",
                          "--epochs", "2", "--no-plot", "--timeout", "8"}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), {"--out-dir", out});
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto start = std::chrono::steady_clock::now();
    ProcessResult r = run_process(argv, {tag_}, 240);
    took_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }
  void expect_nothing_left() {
    EXPECT_TRUE(processes_with_tag(tag_, 5.0).empty()) << "workers survived the launcher";
  }
  std::string dir_, tag_;
  double took_ = 0;
};

TEST_F(DdpTrainFaults, CrashInBackwardIsNamedAndStopsTheJob) {
  ProcessResult r = train(dir_ + "/a", {"--fault", "crash-in-backward", "--fault-step", "3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("SIGABRT"), std::string::npos) << r.err;
  EXPECT_FALSE(lines_with(r.err, "rank 1").empty()) << r.err;
  EXPECT_LT(took_, 60.0);
  expect_nothing_left();
}

TEST_F(DdpTrainFaults, SigkillIsNamed) {
  ProcessResult r = train(dir_ + "/a", {"--fault", "sigkill", "--fault-step", "4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_FALSE(lines_with(r.err, "rank 1").empty()) << r.err;
  EXPECT_LT(took_, 60.0);
  expect_nothing_left();
}

TEST_F(DdpTrainFaults, StoppedRankTimesOutTheOtherWhichNamesIt) {
  ProcessResult r = train(dir_ + "/a", {"--fault", "sigstop", "--fault-step", "4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(r.timed_out);
  // Rank 0 waits for the stopped rank 1 until --timeout (8 s), then fails
  // naming it; the launcher then stops everyone, the stopped rank included.
  std::string all = r.out + r.err;
  EXPECT_NE(all.find("timed out"), std::string::npos) << all;
  // Which of the two it says depends on whether rank 1's first progress
  // record went out before SIGSTOP; both name it.
  EXPECT_TRUE(all.find("rank 1 has not reached it") != std::string::npos ||
              all.find("rank 1 has published no progress yet") != std::string::npos)
      << all;
  EXPECT_LT(took_, 90.0);
  expect_nothing_left();
}

TEST_F(DdpTrainFaults, RestartAfterALostRankEndsLikeAnUninterruptedRun) {
  ProcessResult full = train(dir_ + "/full", {});
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  // Rank 1 dies at step 14 (inside epoch 2) of the first attempt; the
  // restart resumes from the epoch-1 checkpoint.
  ProcessResult r = train(dir_ + "/restarted",
                          {"--resume", "--fault", "sigkill", "--fault-step", "14"},
                          {"--max-restarts", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("resumed from"), std::string::npos) << r.out;
  Checkpoint a = load_checkpoint(*latest_checkpoint_path(dir_ + "/full/checkpoints"));
  Checkpoint b = load_checkpoint(*latest_checkpoint_path(dir_ + "/restarted/checkpoints"));
  ASSERT_EQ(a.step, b.step);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    EXPECT_TRUE(a.model[i].value().equal(b.model[i].value())) << a.model[i].key();
  }
  expect_nothing_left();
}

}  // namespace
}  // namespace ddp::testing
