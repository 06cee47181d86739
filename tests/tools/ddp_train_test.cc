// ddp-train through ddprun on a subset of Fashion-MNIST (--train-samples):
// it learns, every rank ends with the same parameters, the metrics are
// complete, --resume from a checkpoint written inside an epoch ends exactly
// where an uninterrupted run ends, and bad input fails with a clear message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "ddp/checkpoint.h"
#include "ddp/grad_scaler.h"
#include "launcher/process_harness.h"
#include "support/oracle.h"

namespace ddp::testing {
namespace {

const char* kData = "/usr/share/datasets/fashion-mnist";

bool have_data() { return std::ifstream(std::string(kData) + "/train-images-idx3-ubyte.gz").good(); }

// `nproc` ranks (2: 30 steps of 2 x 64 per epoch of 3840 training images).
ProcessResult train(const std::string& out, std::vector<std::string> extra, int nproc = 2) {
  std::vector<std::string> argv = {DDPRUN_PATH, "--standalone", "--nproc-per-node",
                                   std::to_string(nproc),
                                   DDP_TRAIN_PATH, "--out-dir", out, "--train-samples", "3840",
                                   "--test-samples", "1000", "--epochs", "2", "--log-every", "10",
                                   "--timeout", "120"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_process(argv, {}, 300);
}

std::vector<nlohmann::json> records(const std::string& out) {
  std::vector<nlohmann::json> r;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) r.push_back(nlohmann::json::parse(line));
  return r;
}

class DdpTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    dir_ = make_temp_dir();
  }
  void TearDown() override {
    if (!dir_.empty()) remove_tree(dir_);
  }
  std::string dir_;
};

TEST_F(DdpTrain, LearnsAndKeepsReplicasIdentical) {
  ProcessResult r = train(dir_ + "/a", {});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "parameters identical on all 2 ranks").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "epoch 1/2: train loss").size(), 1u) << "rank 0 alone prints: " << r.out;
  EXPECT_EQ(lines_with(r.out, "[rank1]").size(), 0u) << r.out;
  auto recs = records(dir_ + "/a");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1]["test_images"], 1000);  // padding never counts an image twice
  EXPECT_EQ(recs[1]["steps"], 60);
  EXPECT_EQ(recs[1]["global_batch"], 128);
  EXPECT_GT(recs[1]["test_accuracy"].get<double>(), 0.70);
  EXPECT_LT(recs[1]["train_loss"].get<double>(), recs[0]["train_loss"].get<double>());
  EXPECT_TRUE(latest_checkpoint_path(dir_ + "/a/checkpoints").has_value());
}

// README's Python twin of the model (tools/ddp-train/fashion_cnn.py) loads
// a checkpoint's .model.pt with strict=True and gives ten logits.
TEST_F(DdpTrain, TheModelLoadsInPythonsTwin) {
  if (!oracle_configured()) GTEST_SKIP() << kNoOracle;
  ProcessResult r = train(dir_ + "/m", {"--no-plot", "--epochs", "1", "--max-steps", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string path = *latest_checkpoint_path(dir_ + "/m/checkpoints");
  const std::string model = path.substr(0, path.size() - std::string(".ddpckpt").size()) +
                            ".model.pt";
  const std::string script = "import sys, torch\n"
                             "sys.path.insert(0, '" DDP_SOURCE_DIR "/tools/ddp-train')\n"
                             "from fashion_cnn import FashionCnn\n"
                             "m = FashionCnn()\n"
                             "m.load_state_dict(torch.load(sys.argv[1]))\n"
                             "m.eval()\n"
                             "print('logits', tuple(m(torch.zeros(2, 1, 28, 28)).shape))\n";
  std::ofstream(dir_ + "/load.py") << script;
  ProcessResult py = run_process({oracle_python(), dir_ + "/load.py", model}, {}, 120);
  EXPECT_EQ(py.exit_code, 0) << py.out << py.err;
  EXPECT_NE(py.out.find("logits (2, 10)"), std::string::npos) << py.out << py.err;
}

bool same_model(const Checkpoint& a, const Checkpoint& b) {
  if (a.model.size() != b.model.size()) return false;
  for (size_t i = 0; i < a.model.size(); ++i) {
    if (!a.model[i].value().equal(b.model[i].value())) return false;
  }
  return true;
}

TEST_F(DdpTrain, ResumeInsideAnEpochEndsLikeAnUninterruptedRun) {
  ProcessResult full = train(dir_ + "/full", {"--no-plot"});
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  ProcessResult first = train(dir_ + "/split", {"--no-plot", "--max-steps", "45"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  ProcessResult second = train(dir_ + "/split", {"--no-plot", "--resume"});
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_EQ(lines_with(second.out, "(epoch 1, step 45, 1920 of the epoch's 3840 samples done)")
                .size(),
            1u)
      << second.out;
  Checkpoint a = load_checkpoint(*latest_checkpoint_path(dir_ + "/full/checkpoints"));
  Checkpoint b = load_checkpoint(*latest_checkpoint_path(dir_ + "/split/checkpoints"));
  EXPECT_EQ(a.epoch, 2);
  EXPECT_EQ(b.epoch, 2);
  EXPECT_EQ(a.step, 60);
  EXPECT_EQ(b.step, 60);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    EXPECT_TRUE(a.model[i].value().equal(b.model[i].value())) << a.model[i].key();
  }
}

// Note [Resuming inside an epoch]: 2 ranks stop 15 batches into epoch 2
// (1920 of its 3840 samples); resumed on 4 ranks, which take 15 batches per
// epoch, the other 1920 samples are shared out as 8 batches of 64 on each
// (the last one 32) and training ends (ddp-train once skipped the 15
// batches it counted, found nothing left and failed every round). A
// checkpoint of an older ddp-train (epoch_batches, no epoch_samples) means
// the same samples: batches on the world size its record names.
TEST_F(DdpTrain, ResumeInsideAnEpochOnALargerWorldTrainsTheRestOfTheEpoch) {
  ProcessResult first = train(dir_ + "/grow", {"--no-plot", "--max-steps", "45"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string path = *latest_checkpoint_path(dir_ + "/grow/checkpoints");
  Checkpoint older = load_checkpoint(path);
  EXPECT_EQ(older.metadata.at("epoch_samples"), "1920");
  older.metadata.erase("epoch_samples");
  older.metadata["epoch_batches"] = "15";
  for (const Checkpoint* as : std::vector<const Checkpoint*>{nullptr, &older}) {
    const std::string dir = dir_ + (as != nullptr ? "/older" : "/grow");
    if (as != nullptr) {
      std::filesystem::create_directories(dir + "/checkpoints");
      std::ofstream(dir + "/checkpoints/" + std::filesystem::path(path).filename().string(),
                    std::ios::binary)
          << detail::serialize_checkpoint(*as);
    }
    ProcessResult second = train(dir, {"--no-plot", "--resume"}, 4);
    ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
    EXPECT_EQ(lines_with(second.out, "world size 4 where the checkpoint's run had 2").size(), 1u)
        << second.out;
    EXPECT_EQ(lines_with(second.out, "(epoch 1, step 45, 1920 of the epoch's 3840 samples done)")
                  .size(),
              1u)
        << second.out;
    EXPECT_EQ(lines_with(second.out, "epoch 2/2: train loss").size(), 1u) << second.out;
    EXPECT_EQ(lines_with(second.out, "parameters identical on all 4 ranks").size(), 1u)
        << second.out;
    const Checkpoint done = load_checkpoint(*latest_checkpoint_path(dir + "/checkpoints"));
    EXPECT_EQ(done.epoch, 2);
    EXPECT_EQ(done.step, 53);  // 45 + 8
    EXPECT_EQ(done.metadata.at("epoch_samples"), "0");
  }
}

// --augment draws from each batch's own generator (BatchLoaderOptions:
// seed, epoch, rank, batch number): the same run with 0 or 2 loader threads
// ends with the same parameters, and so does one resumed inside an epoch
// (its batches keep their numbers, first_batch); without the augmentation
// the parameters differ, so it did change the images.
TEST_F(DdpTrain, AugmentationIsTheSameForAnyLoaderThreadsAndAcrossAResume) {
  const std::vector<std::string> aug = {"--no-plot", "--augment", "flip-shift"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = aug;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ASSERT_EQ(train(dir_ + "/w0", with({"--workers", "0"})).exit_code, 0);
  ASSERT_EQ(train(dir_ + "/w2", with({"--workers", "2"})).exit_code, 0);
  ASSERT_EQ(train(dir_ + "/split", with({"--max-steps", "45"})).exit_code, 0);
  ProcessResult resumed = train(dir_ + "/split", with({"--resume"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  ASSERT_EQ(train(dir_ + "/plain", {"--no-plot"}).exit_code, 0);
  auto last = [&](const std::string& run) {
    return load_checkpoint(*latest_checkpoint_path(dir_ + "/" + run + "/checkpoints"));
  };
  const Checkpoint w0 = last("w0");
  EXPECT_EQ(w0.step, 60);
  EXPECT_TRUE(same_model(w0, last("w2"))) << "the loader threads changed the draws";
  EXPECT_TRUE(same_model(w0, last("split"))) << "a resumed epoch drew other numbers";
  EXPECT_FALSE(same_model(w0, last("plain"))) << "--augment changed nothing";
}

// Note [Interrupted training]: Ctrl-C (SIGINT to ddprun, which passes it
// on) stops both ranks after the same step with a checkpoint, says where
// and how to continue, draws the plot and exits 130; --resume then
// finishes the run.
TEST_F(DdpTrain, InterruptSavesSaysHowToContinueAndResumes) {
  const std::string out = dir_ + "/a";
  std::vector<std::string> argv = {DDPRUN_PATH, "--standalone", "--nproc-per-node", "2",
                                   DDP_TRAIN_PATH, "--out-dir", out, "--train-samples", "3840",
                                   "--test-samples", "1000", "--epochs", "2", "--log-every", "5",
                                   "--timeout", "120"};
  TestProcess p(argv, {});
  // Inside epoch 2: epoch 1's line is there to plot.
  ASSERT_TRUE(p.wait_for_output("epoch 2/2 step 5/30", 120)) << p.output_so_far();
  p.send_signal(SIGINT);
  ProcessResult r = p.wait(60);
  EXPECT_EQ(r.exit_code, 130) << r.out << r.err;
  const std::vector<std::string> said = lines_with(r.out, "ddp-train: interrupted by SIGINT at step ");
  ASSERT_EQ(said.size(), 1u) << "rank 0 alone says it: " << r.out << r.err;
  EXPECT_NE(said[0].find("Continue with the same flags and --resume"), std::string::npos)
      << said[0];
  const std::optional<std::string> latest = latest_checkpoint_path(out + "/checkpoints");
  ASSERT_TRUE(latest.has_value()) << r.out;
  EXPECT_NE(said[0].find("latest checkpoint " + *latest), std::string::npos) << said[0];
  const Checkpoint ckpt = load_checkpoint(*latest);
  EXPECT_NE(said[0].find("at step " + std::to_string(ckpt.step) + " ("), std::string::npos) << said[0];
  EXPECT_GT(ckpt.step, 30);
  EXPECT_LT(ckpt.step, 60);
  EXPECT_NE(said[0].find("(epoch 2/2, batch "), std::string::npos) << said[0];
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(std::filesystem::exists(out + "/metrics.png")) << r.out << r.err;
  }
  ProcessResult resumed = train(out, {"--no-plot", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const Checkpoint last = load_checkpoint(*latest_checkpoint_path(out + "/checkpoints"));
  EXPECT_EQ(last.epoch, 2);
  EXPECT_EQ(last.step, 60);
}

// Note [One run per directory]: a second run into a directory that holds
// one is refused, naming it; --resume with another run's flags names each
// difference; a resume cuts metrics.jsonl back to the checkpoint's past
// (a line past it, and the line of the epoch it stopped inside); and
// --overwrite replaces the run.
TEST_F(DdpTrain, ADirectoryHoldingARunIsRefusedResumedOnlyAsItselfOrReplaced) {
  const std::string out = dir_ + "/a";
  ProcessResult first = train(out, {"--no-plot", "--max-steps", "45"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  ASSERT_EQ(records(out).size(), 2u);  // epoch 1, and epoch 2 up to step 45

  ProcessResult again = train(out, {"--no-plot"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("ddp-train: --out-dir " + out + " holds another run (" + out +
                           "/metrics.jsonl with 2 epochs, "),
            std::string::npos)
      << again.err;
  EXPECT_NE(again.err.find("continue it with --resume"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("replace it with --overwrite"), std::string::npos) << again.err;

  ProcessResult other = train(out, {"--no-plot", "--resume", "--seed", "1", "--optimizer", "sgd"});
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.err.find("belongs to another run: --seed gives 1, but the checkpoint's run "
                           "used 0; --optimizer gives \"sgd\", but the checkpoint's run used "
                           "\"adam\""),
            std::string::npos)
      << other.err;

  std::ofstream(out + "/metrics.jsonl", std::ios::app) << "{\"epoch\": 2, \"steps\": 50}\n";
  ProcessResult resumed = train(out, {"--no-plot", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(lines_with(resumed.out, "dropped 2 lines of").size(), 1u) << resumed.out;
  std::vector<nlohmann::json> recs = records(out);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["epoch"], 1);
  EXPECT_EQ(recs[0]["steps"], 30);
  EXPECT_EQ(recs[1]["epoch"], 2);
  EXPECT_EQ(recs[1]["steps"], 60);

  // Another schedule and more epochs: both named at once.
  ProcessResult schedule = train(out, {"--no-plot", "--resume", "--schedule", "constant",
                                       "--epochs", "3"});
  EXPECT_NE(schedule.exit_code, 0);
  EXPECT_NE(schedule.err.find("--schedule gives \"constant\""), std::string::npos) << schedule.err;
  EXPECT_NE(schedule.err.find("--epochs gives 3"), std::string::npos) << schedule.err;

  // A new --out-dir with this run's --checkpoint-dir: the checkpoint
  // directory is named, and --overwrite does not remove another run's files.
  const std::string other_out = dir_ + "/b";
  ProcessResult borrowed = train(other_out, {"--no-plot", "--checkpoint-dir", out + "/checkpoints"});
  EXPECT_NE(borrowed.exit_code, 0);
  EXPECT_NE(borrowed.err.find("ddp-train: --checkpoint-dir " + out + "/checkpoints holds another run"),
            std::string::npos)
      << borrowed.err;
  ProcessResult taken = train(other_out, {"--no-plot", "--checkpoint-dir", out + "/checkpoints",
                                          "--overwrite"});
  EXPECT_NE(taken.exit_code, 0);
  EXPECT_NE(taken.err.find("not replaced"), std::string::npos) << taken.err;
  EXPECT_TRUE(latest_checkpoint_path(out + "/checkpoints").has_value());

  ProcessResult replaced = train(out, {"--no-plot", "--overwrite", "--max-steps", "30"});
  ASSERT_EQ(replaced.exit_code, 0) << replaced.out << replaced.err;
  EXPECT_EQ(records(out).size(), 1u);
  const Checkpoint latest = load_checkpoint(*latest_checkpoint_path(out + "/checkpoints"));
  EXPECT_EQ(latest.step, 30);
}

// A checkpoint whose metadata ddp-train did not write: --resume fails
// naming the file, the key and the value (not std::stoll's "stoll", nor
// nlohmann's type_error for a run record of another shape), and a
// GradScaler state no scaler reaches is refused, not trained with.
TEST_F(DdpTrain, ResumeFromBadMetadataNamesTheKeyAndTheFile) {
  ProcessResult first = train(dir_ + "/bad", {"--no-plot", "--epochs", "1", "--max-steps", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string path = *latest_checkpoint_path(dir_ + "/bad/checkpoints");
  Checkpoint c = load_checkpoint(path);
  c.metadata["epoch_samples"] = "many";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << detail::serialize_checkpoint(c);
  ProcessResult second = train(dir_ + "/bad", {"--no-plot", "--epochs", "1", "--resume"});
  EXPECT_NE(second.exit_code, 0) << second.out << second.err;
  const std::string all = second.out + second.err;
  EXPECT_NE(all.find("metadata 'epoch_samples' = 'many' is not a count"), std::string::npos) << all;
  EXPECT_NE(all.find(std::filesystem::path(path).filename().string() + "': metadata"),
            std::string::npos)
      << all;

  const Checkpoint good = load_checkpoint(path);
  auto resume_with = [&](const std::string& key, const std::string& value) {
    Checkpoint bad = good;
    bad.metadata[key] = value;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << detail::serialize_checkpoint(bad);
    ProcessResult r = train(dir_ + "/bad", {"--no-plot", "--epochs", "1", "--resume"});
    EXPECT_NE(r.exit_code, 0) << key << "=" << value;
    return r.out + r.err;
  };
  nlohmann::json record = nlohmann::json::parse(good.metadata.at("config"));
  record["world_size"] = "two";
  for (const std::string& config : {std::string("[1, 2]"), record.dump()}) {
    const std::string said = resume_with("config", config);
    EXPECT_NE(said.find("metadata 'config' is not the run record ddp-train writes"),
              std::string::npos)
        << said;
    EXPECT_EQ(said.find("json.exception"), std::string::npos) << said;
  }
  const std::string beyond = resume_with("epoch_samples", "3840");
  EXPECT_NE(beyond.find("metadata says 3840 samples of epoch 1 were done, but the epoch has 3840 "
                        "(--train-samples)"),
            std::string::npos)
      << beyond;
  const std::string twice = resume_with(
      "grad_scaler", "scale=1 scale=1 scale=1 scale=1 scale=1");
  EXPECT_NE(twice.find("metadata 'grad_scaler': GradScalerState::from_string: 'scale=1 scale=1 "
                       "scale=1 scale=1 scale=1' is not a GradScaler state ('scale' twice)"),
            std::string::npos)
      << twice;
}

// --amp fp16: autocast and a GradScaler whose state the checkpoints keep, so
// a run stopped inside an epoch and resumed ends with the parameters and
// the scale of the run that never stopped. (Small batches: float16
// convolutions are slow on a CPU.)
TEST_F(DdpTrain, AmpFp16ResumesWithItsScalerExactly) {
  const std::vector<std::string> small = {"--no-plot", "--amp", "fp16", "--batch-size", "16",
                                          "--train-samples", "256", "--test-samples", "100"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = small;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ProcessResult full = train(dir_ + "/full", with({}));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_NE(full.out.find(", amp fp16"), std::string::npos) << full.out;
  ASSERT_EQ(train(dir_ + "/split", with({"--max-steps", "5"})).exit_code, 0);
  ProcessResult resumed = train(dir_ + "/split", with({"--resume"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const Checkpoint a = load_checkpoint(*latest_checkpoint_path(dir_ + "/full/checkpoints"));
  const Checkpoint b = load_checkpoint(*latest_checkpoint_path(dir_ + "/split/checkpoints"));
  EXPECT_EQ(a.step, 16);
  ASSERT_TRUE(a.metadata.count("grad_scaler")) << "the scaler's state is not in the checkpoint";
  EXPECT_EQ(a.metadata.at("grad_scaler"), b.metadata.at("grad_scaler"));
  EXPECT_GT(GradScalerState::from_string(a.metadata.at("grad_scaler")).scale, 0);
  EXPECT_TRUE(same_model(a, b));
  ProcessResult bf16 = train(dir_ + "/full", with({"--resume", "--amp", "bf16"}));
  EXPECT_NE(bf16.err.find("--amp gives \"bf16\", but the checkpoint's run used \"fp16\""),
            std::string::npos)
      << bf16.err;
}

// A checkpoint of an older ddp-train records no augmentation or label
// smoothing: its run had none, whatever today's defaults are, so resuming
// it with the defaults names the difference, and with its values goes on.
TEST_F(DdpTrain, ResumingAnOlderRunComparesWithTheValuesItHad) {
  const std::string out = dir_ + "/old";
  ProcessResult first = train(out, {"--no-plot", "--epochs", "1", "--max-steps", "2",
                                    "--label-smoothing", "0"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string path = *latest_checkpoint_path(out + "/checkpoints");
  Checkpoint c = load_checkpoint(path);
  nlohmann::json config = nlohmann::json::parse(c.metadata.at("config"));
  config.erase("augment");
  config.erase("label_smoothing");
  c.metadata["config"] = config.dump();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << detail::serialize_checkpoint(c);
  ProcessResult with_defaults = train(out, {"--no-plot", "--epochs", "1", "--resume"});
  EXPECT_NE(with_defaults.exit_code, 0);
  EXPECT_NE(with_defaults.err.find("--label-smoothing gives 0.1, but the checkpoint's run used 0.0"),
            std::string::npos)
      << with_defaults.err;
  ProcessResult as_it_was = train(out, {"--no-plot", "--epochs", "1", "--resume",
                                        "--label-smoothing", "0"});
  EXPECT_EQ(as_it_was.exit_code, 0) << as_it_was.out << as_it_was.err;
}

// --sync-bn: ddp::SyncBatchNorm layers under the same names (a checkpoint
// holds bn1/bn2's buffers, updated once per step); it learns and the
// replicas stay identical.
TEST_F(DdpTrain, SyncBatchNormTrains) {
  ProcessResult r = train(dir_ + "/s", {"--no-plot", "--sync-bn", "--epochs", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, ", SyncBatchNorm").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "parameters identical on all 2 ranks").size(), 1u) << r.out;
  auto recs = records(dir_ + "/s");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_GT(recs[0]["test_accuracy"].get<double>(), 0.60);
  Checkpoint c = load_checkpoint(*latest_checkpoint_path(dir_ + "/s/checkpoints"));
  bool found = false;
  for (const auto& t : c.model) {
    if (t.key() != "bn1.num_batches_tracked") continue;
    found = true;
    EXPECT_EQ(t.value().item<int64_t>(), 30);
  }
  EXPECT_TRUE(found);
}

// Every numeric flag has a range and a one-line error naming the flag;
// "all" is spelled out.
TEST_F(DdpTrain, BadFlagValuesNameTheFlagAndTheRange) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--epochs", "0"}, "--epochs: must be an integer from 1 to 2147483647, got 0"},
      {{"--train-samples", "0"}, "--train-samples: must be a count >= 1 or all, got 0"},
      {{"--test-samples", "-3"}, "--test-samples: must be a count >= 1 or all, got -3"},
      {{"--max-steps", "0"}, "--max-steps: must be a count >= 1 or all, got 0"},
      {{"--lr", "-1"}, "--lr: must be a finite number > 0, got -1"},
      {{"--lr", "inf"}, "--lr: must be a finite number > 0, got inf"},
      {{"--batch-size", "x"}, "--batch-size: must be an integer from 1 to 2147483647, got x"},
      {{"--epochs", "99999999999"},
       "--epochs: must be an integer from 1 to 2147483647, got 99999999999"},
      {{"--seed", "-1"}, "--seed: must be an integer >= 0, got -1"},
      // "all" passes (the flags after them are checked later, in order).
      {{"--max-steps", "all", "--train-samples", "all", "--test-samples=all", "--log-every", "0"},
       "--log-every: must be an integer from 1 to 2147483647, got 0"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {DDP_TRAIN_PATH};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ProcessResult r = run_process(argv, {}, 60);
    EXPECT_NE(r.exit_code, 0) << flags[0];
    EXPECT_EQ(lines_with(r.out + r.err, message).size(), 1u) << r.out << r.err;
    EXPECT_EQ((r.out + r.err).find("0000000"), std::string::npos) << r.out << r.err;
  }
}

// An unknown flag: one line, the flag as given and the closest one, exit 2
// (not CLI11's "not expected: 2 --epoch", nor "ddp-train failed: ddp-train:").
TEST_F(DdpTrain, AnUnknownFlagIsNamedWithTheClosestKnownOne) {
  ProcessResult r = run_process({DDP_TRAIN_PATH, "--epoch", "2"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(lines_with(r.err, "ddp-train: error: unknown flag --epoch (did you mean --epochs?) "
                              "(see ddp-train --help)")
                .size(),
            1u)
      << r.err;
  EXPECT_EQ(r.err.find("failed"), std::string::npos) << r.err;
  for (const char* bad : {"nan", "1", "-0.1", "abc"}) {
    ProcessResult ls = run_process({DDP_TRAIN_PATH, "--label-smoothing", bad}, {}, 60);
    EXPECT_EQ(ls.exit_code, 2) << bad;
    EXPECT_NE(ls.err.find(std::string("must be a number in [0, 1), got ") + bad),
              std::string::npos)
        << ls.err;
  }
}

// An output directory that cannot be written fails at start-up, on every
// rank, naming the flag, the path and the reason; nothing is trained.
TEST_F(DdpTrain, UnwritableOutputDirectoryFailsAtStartOnEveryRank) {
  if (::geteuid() == 0) {
    // root writes anywhere: use a path below a regular file instead.
    std::ofstream(dir_ + "/file") << "x";
  } else {
    std::filesystem::create_directories(dir_ + "/file");
    std::filesystem::permissions(dir_ + "/file", std::filesystem::perms::owner_read);
  }
  const std::string out = dir_ + "/file/out";
  ProcessResult r = train(out, {"--no-plot"});
  EXPECT_NE(r.exit_code, 0);
  for (const char* rank : {"[rank0]:", "[rank1]:"}) {
    bool named = false;
    for (const std::string& l : lines_with(r.out + r.err, rank)) {
      named = named || l.find("ddp-train: --out-dir '" + out + "' cannot be created: Not a "
                              "directory; choose a writable directory") != std::string::npos ||
              l.find("ddp-train: --out-dir '" + out + "' cannot be written") != std::string::npos;
    }
    EXPECT_TRUE(named) << rank << ":\n" << r.out << r.err;
  }
  EXPECT_TRUE(lines_with(r.out, "epoch 1/2").empty()) << r.out;
}

// Under ddprun on a terminal (a pseudo-terminal from script(1)), rank 0
// draws a live bar in place, with a real ETA; into a pipe, plain lines
// carry an ETA too.
TEST_F(DdpTrain, ProgressBarUnderTheLauncherOnATerminal) {
  if (::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is missing";
  std::string cmd;
  for (const std::string& a : {std::string(DDPRUN_PATH), std::string("--standalone"),
                               std::string("--nproc-per-node"), std::string("2"),
                               std::string(DDP_TRAIN_PATH), std::string("--out-dir"), dir_ + "/tty",
                               std::string("--train-samples"), std::string("3840"),
                               std::string("--test-samples"), std::string("500"),
                               std::string("--epochs"), std::string("1"),
                               std::string("--no-plot")}) {
    cmd += "'" + a + "' ";
  }
  ProcessResult r = run_process({"/usr/bin/script", "-qfec", cmd, "/dev/null"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\r[rank0]:epoch 1/1 ["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("] 30/30 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ETA ?"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[rank1]:"), std::string::npos) << "rank 0 alone draws: " << r.out;
  // The same into a pipe: lines, each with an ETA.
  ProcessResult piped = train(dir_ + "/pipe", {"--no-plot", "--epochs", "1"});
  ASSERT_EQ(piped.exit_code, 0) << piped.out << piped.err;
  auto lines = lines_with(piped.out, "epoch 1/1 step 10/30");
  ASSERT_EQ(lines.size(), 1u) << piped.out;
  EXPECT_EQ(lines[0].find("ETA ?"), std::string::npos) << lines[0];
  // The line says what its numbers are (the last steps' means, accuracy in
  // %), so that they are not taken for the epoch's, which its line has.
  EXPECT_NE(lines[0].find("step 10/30 last 10 steps: loss "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(" % | "), std::string::npos) << lines[0];
  const auto epoch = lines_with(piped.out, "epoch 1/1: train loss ");
  ASSERT_EQ(epoch.size(), 1u) << piped.out;
  EXPECT_NE(epoch[0].find(" % | test loss "), std::string::npos) << epoch[0];
  EXPECT_EQ(piped.out.find('\r'), std::string::npos) << piped.out;
}

TEST_F(DdpTrain, MissingDataNamesTheFile) {
  ProcessResult r = run_process({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2",
                                 DDP_TRAIN_PATH, "--data-dir", dir_ + "/nothing"},
                                {}, 120);
  EXPECT_NE(r.exit_code, 0);
  std::string all = r.out + r.err;
  EXPECT_NE(all.find(dir_ + "/nothing/train-images-idx3-ubyte.gz"), std::string::npos) << all;
}

TEST_F(DdpTrain, DemoAllReducesOnThreeRanks) {
  ProcessResult r = run_process({DDPRUN_PATH, "--standalone", "--nproc-per-node", "3",
                                 DDP_DEMO_PATH}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(lines_with(r.out, "world_size 3, all_reduce sum 6 (correct)").size(), 1u) << r.out;
}

}  // namespace
}  // namespace ddp::testing
