// ddp-train --fully-shard through ddprun: the sharded main job trains to
// DDP's values; its checkpoints (full state) continue sharded on the same
// world exactly as an uninterrupted run, and on another world sharded or
// under DDP alike; DDP's flags are refused beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ddp/checkpoint.h"
#include "launcher/process_harness.h"

namespace ddp::testing {
namespace {

bool have_data() {
  return std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good();
}

class DdpTrainFullyShard : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    dir_ = make_temp_dir();
  }
  void TearDown() override {
    if (!dir_.empty()) remove_tree(dir_);
  }
  // 1280 training images: 10 steps of 2 x 64 per epoch at W=2, 7 at W=3.
  ProcessResult train(const std::string& out, std::vector<std::string> extra, int nproc = 2) {
    std::vector<std::string> argv = {DDPRUN_PATH,    "--standalone",    "--nproc-per-node",
                                     std::to_string(nproc), DDP_TRAIN_PATH, "--out-dir",
                                     out,            "--train-samples", "1280",
                                     "--test-samples", "300",           "--epochs",
                                     "2",            "--no-plot",       "--timeout",
                                     "120"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv, {}, 300);
  }
  Checkpoint latest(const std::string& out) {
    return load_checkpoint(*latest_checkpoint_path(out + "/checkpoints"));
  }
  std::string dir_;
};

void expect_models(const Checkpoint& a, const Checkpoint& b, bool exact, const std::string& what) {
  ASSERT_EQ(a.model.size(), b.model.size()) << what;
  EXPECT_EQ(a.step, b.step) << what;
  for (size_t i = 0; i < a.model.size(); ++i) {
    const at::Tensor& x = a.model[i].value();
    const at::Tensor& y = b.model[i].value();
    EXPECT_EQ(a.model[i].key(), b.model[i].key()) << what;
    EXPECT_TRUE(exact ? x.equal(y) : x.allclose(y, 1e-4, 1e-5))
        << what << ": " << a.model[i].key() << " differs by "
        << (x - y).abs().max().item<double>();
  }
}

TEST_F(DdpTrainFullyShard, TrainsToDdpsValuesAndContinuesOnAnyWorldShardedOrNot) {
  ProcessResult ddp = train(dir_ + "/ddp", {});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.out << ddp.err;
  ProcessResult sharded = train(dir_ + "/fsdp", {"--fully-shard"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  EXPECT_EQ(lines_with(sharded.out, "1 loader thread, label smoothing 0.1, fully_shard").size(), 1u)
      << sharded.out;
  EXPECT_EQ(lines_with(sharded.out, "parameters identical on all 2 ranks").size(), 1u)
      << sharded.out;
  // The BatchNorm statistics too: rank 0's, as DDP's broadcast makes them.
  expect_models(latest(dir_ + "/ddp"), latest(dir_ + "/fsdp"), false, "sharded vs DDP");

  // Stopped in epoch 2 (640 of its 1280 samples done), continued. SGD:
  // Adam turns the float noise of gradients that are zero in exact
  // arithmetic (a convolution's bias before BatchNorm) into steps of the
  // learning rate's size, so 3 ranks' different summation orders would
  // differ by more than rounding.
  const std::vector<std::string> sgd = {"--fully-shard", "--optimizer", "sgd"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), sgd.begin(), sgd.end());
    return more;
  };
  ProcessResult whole = train(dir_ + "/whole", with({}));
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const std::string split = dir_ + "/split";
  ProcessResult first = train(split, with({"--max-steps", "15"}));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  for (const char* copy : {"/on3", "/ddp3"}) {
    std::filesystem::copy(split, dir_ + copy, std::filesystem::copy_options::recursive);
  }
  ProcessResult same = train(split, with({"--resume"}));
  ASSERT_EQ(same.exit_code, 0) << same.out << same.err;
  expect_models(latest(dir_ + "/whole"), latest(split), true, "continued on 2 ranks");

  ProcessResult on3 = train(dir_ + "/on3", with({"--resume"}), 3);
  ASSERT_EQ(on3.exit_code, 0) << on3.out << on3.err;
  ProcessResult ddp3 = train(dir_ + "/ddp3", {"--optimizer", "sgd", "--resume"}, 3);
  ASSERT_EQ(ddp3.exit_code, 0) << ddp3.out << ddp3.err;
  for (const ProcessResult* r : {&on3, &ddp3}) {
    EXPECT_EQ(lines_with(r->out, "(epoch 1, step 15, 640 of the epoch's 1280 samples done)").size(),
              1u)
        << r->out;
  }
  EXPECT_EQ(latest(dir_ + "/on3").step, 19);  // 15 + 640 / (3 x 64) rounded up
  expect_models(latest(dir_ + "/on3"), latest(dir_ + "/ddp3"), false, "3 ranks, sharded vs DDP");
}

TEST_F(DdpTrainFullyShard, DdpsOwnFlagsAreRefusedBesideIt) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--comm-hook", "fp16"},
       "ddp-train: error: --comm-hook fp16 is DistributedDataParallel's, and --fully-shard "
       "reduce-scatters gradients instead: drop one of the two flags"},
      {{"--static-graph"}, "ddp-train: error: --static-graph excludes --fully-shard"},
      {{"--find-unused-parameters"},
       "ddp-train: error: --find-unused-parameters excludes --fully-shard"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {DDP_TRAIN_PATH, "--fully-shard"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ProcessResult r = run_process(argv, {}, 60);
    EXPECT_EQ(r.exit_code, 2) << flags[0];
    EXPECT_EQ(lines_with(r.err, message).size(), 1u) << r.out << r.err;
  }
}

}  // namespace
}  // namespace ddp::testing
