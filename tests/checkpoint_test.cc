// Checkpoints: bit-exact round trips of model, buffers and optimizer state
// for every supported optimizer; resuming gives exactly the parameters of an
// uninterrupted run; files, latest and keep_last; a crash before the rename;
// truncated, corrupt, foreign and mutated files give InvalidArgument (never
// a crash); collective save/load over 2 ranks; torch.load in Python.
#include "checkpoint/checkpoint_format.h"
#include "ddp/checkpoint.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <zlib.h>

#include <poll.h>
#include <sys/resource.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <fstream>
#include <random>

#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using testing::is_a;
using testing::message_of;
using testing::run_ranks_collect;
using testing::TempDir;

// fc1 -> bn -> relu -> dropout -> fc2: parameters, buffers (BatchNorm
// running stats, an int64 counter) and a use of the RNG in every step.
struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
  explicit NetImpl(int hidden = 3) {
    fc1 = register_module("fc1", torch::nn::Linear(4, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc2(drop(bn(fc1(x)).relu()));
  }
};
TORCH_MODULE(Net);

// A derived optimizer: not one ddp knows, so it goes through libtorch's
// archive.
struct CustomSGD : torch::optim::SGD {
  using SGD::SGD;
};

namespace optim = torch::optim;

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, Net& net) {
  auto params = net->parameters();
  if (name == "SGD") {
    // Two groups with their own options.
    std::vector<at::Tensor> head = net->fc2->parameters();
    std::vector<at::Tensor> body;
    for (auto& p : params) {
      bool in_head = false;
      for (auto& h : head) in_head = in_head || p.is_same(h);
      if (!in_head) body.push_back(p);
    }
    std::vector<optim::OptimizerParamGroup> groups;
    groups.emplace_back(body);
    groups.emplace_back(head, std::make_unique<optim::SGDOptions>(
                                  optim::SGDOptions(0.05).momentum(0.5)));
    return std::make_unique<optim::SGD>(
        groups, optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3));
  }
  if (name == "Adam") {
    return std::make_unique<optim::Adam>(params, optim::AdamOptions(0.01).amsgrad(true));
  }
  if (name == "AdamW") {
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(0.01).weight_decay(0.1));
  }
  if (name == "Adagrad") {
    return std::make_unique<optim::Adagrad>(params, optim::AdagradOptions(0.1).lr_decay(0.01));
  }
  if (name == "RMSprop") {
    return std::make_unique<optim::RMSprop>(
        params, optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
  }
  return std::make_unique<CustomSGD>(params, optim::SGDOptions(0.1).momentum(0.9));
}

// Steps draw their data from the global RNG, and dropout draws from it too.
void train(Net& net, optim::Optimizer& opt, int steps) {
  net->train();
  for (int i = 0; i < steps; ++i) {
    at::Tensor x = at::randn({8, 4});
    at::Tensor y = at::randn({8, 2});
    opt.zero_grad();
    at::Tensor loss = (net->forward(x) - y).pow(2).mean();
    loss.backward();
    opt.step();
  }
}

void expect_same_state(Net& a, Net& b) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  auto ba = a->named_buffers(), bb = b->named_buffers();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  }
  for (size_t i = 0; i < ba.size(); ++i) {
    EXPECT_TRUE(at::equal(ba[i].value(), bb[i].value())) << ba[i].key();
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Recomputes the payload CRC of a file image (header 16 bytes, trailer 20).
void refresh_crc(std::string& b) {
  uint32_t crc = static_cast<uint32_t>(crc32(
      0, reinterpret_cast<const Bytef*>(b.data() + 16), b.size() - 36));
  std::memcpy(&b[b.size() - 12], &crc, 4);
}

std::string message_of_load(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(loaded)";
}

class OptimizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerTest, RoundTripRestoresEverythingBitExactly) {
  at::manual_seed(1);
  Net net;
  auto opt = make_optimizer(GetParam(), net);
  train(net, *opt, 3);
  // As a scheduler would: the restored optimizer must use this lr.
  opt->param_groups()[0].options().set_lr(0.0375);
  Checkpoint saved = capture_checkpoint(*net, opt.get(), 2, 3);
  Checkpoint loaded = detail::parse_checkpoint(detail::serialize_checkpoint(saved), "memory");

  Net other;  // other initial values
  auto other_opt = make_optimizer(GetParam(), other);
  restore_checkpoint(loaded, *other, other_opt.get());
  expect_same_state(net, other);
  EXPECT_EQ(other_opt->param_groups()[0].options().get_lr(), 0.0375);
  EXPECT_EQ(loaded.epoch, 2);
  EXPECT_EQ(loaded.step, 3);

  // Same optimizer state: one more identical step gives identical results.
  at::manual_seed(7);
  train(net, *opt, 1);
  at::manual_seed(7);
  train(other, *other_opt, 1);
  expect_same_state(net, other);
}

// A fresh "process" resuming from the latest checkpoint in `dir`, then
// training `steps` more steps.
Net resume(const std::string& dir, const std::string& optimizer, int steps,
           const RestoreOptions& options = {}) {
  at::manual_seed(12345);  // a new process starts from another RNG state
  Net net(3);
  auto opt = make_optimizer(optimizer, net);
  std::optional<Checkpoint> ckpt = load_latest_checkpoint(dir);
  EXPECT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->step, 3);
  restore_checkpoint(*ckpt, *net, opt.get(), options);
  train(net, *opt, steps);
  return net;
}

bool same_parameters(Net& a, Net& b) {
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!at::equal(pa[i], pb[i])) return false;
  }
  return true;
}

TEST_P(OptimizerTest, ResumeEndsWithTheParametersOfAnUninterruptedRun) {
  TempDir dir;
  at::manual_seed(3);
  Net straight;
  auto straight_opt = make_optimizer(GetParam(), straight);
  straight_opt->param_groups()[0].options().set_lr(0.02);
  train(straight, *straight_opt, 6);

  at::manual_seed(3);
  {
    Net first;
    auto opt = make_optimizer(GetParam(), first);
    opt->param_groups()[0].options().set_lr(0.02);
    train(first, *opt, 3);
    save_checkpoint(dir.path(), *first, opt.get(), 1, 3);
  }
  Net resumed = resume(dir.path(), GetParam(), 3);
  expect_same_state(straight, resumed);

  // Controls: each part of the checkpoint matters to the result.
  RestoreOptions no_rng;
  no_rng.rng = false;
  Net without_rng = resume(dir.path(), GetParam(), 3, no_rng);
  EXPECT_FALSE(same_parameters(straight, without_rng));
  RestoreOptions no_optimizer;
  no_optimizer.optimizer = false;
  Net without_optimizer = resume(dir.path(), GetParam(), 3, no_optimizer);
  EXPECT_FALSE(same_parameters(straight, without_optimizer));
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerTest,
                         ::testing::Values("SGD", "Adam", "AdamW", "Adagrad",
                                           "RMSprop", "CustomSGD"));

TEST(Checkpoint, FilesLatestAndKeepLast) {
  TempDir dir;
  EXPECT_FALSE(latest_checkpoint_path(dir.file("missing")).has_value());
  EXPECT_FALSE(load_latest_checkpoint(dir.path()).has_value());
  Net net;
  SaveOptions o;
  o.keep_last = 2;
  o.metadata = {{"config", "{\"lr\": 0.1}"}};
  for (int epoch = 1; epoch <= 3; ++epoch) {
    std::string path = save_checkpoint(dir.path(), *net, nullptr, epoch, 100 * epoch, o);
    EXPECT_EQ(path, dir.path() + "/checkpoint-epoch00000" + std::to_string(epoch) +
                        "-step000000000" + std::to_string(100 * epoch) + ".ddpckpt");
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "checkpoint-epoch000002-step000000000200.ddpckpt",
                       "checkpoint-epoch000002-step000000000200.model.pt",
                       "checkpoint-epoch000003-step000000000300.ddpckpt",
                       "checkpoint-epoch000003-step000000000300.model.pt"}));
  auto ckpt = load_latest_checkpoint(dir.path());
  ASSERT_TRUE(ckpt);
  EXPECT_EQ(ckpt->epoch, 3);
  EXPECT_EQ(ckpt->metadata.at("config"), "{\"lr\": 0.1}");
  EXPECT_EQ(ckpt->optimizer, nullptr);
  EXPECT_EQ(ckpt->rng.size(), 1u);
  // Model keys are the module's own names, parameters then buffers.
  std::vector<std::string> keys = ckpt->model.keys();
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                      "fc2.weight", "fc2.bias", "bn.running_mean",
                      "bn.running_var", "bn.num_batches_tracked"}));
}

// Note [Call labels]: save_checkpoint on rank 0 alone (the Python habit)
// times out naming the call and saying that it is collective, and the
// stall report says where the other rank was: after DDP's backward.
TEST(Checkpoint, SavingOnRankZeroAloneNamesTheCallAndWhereTheOthersAre) {
  TempDir dir;
  testing::ThreadWorldOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  std::atomic<bool> rank0_done{false};
  auto errors = run_ranks_collect(2, [&](int r) {
    torch::nn::Linear lin(4, 2);
    DistributedDataParallel<torch::nn::Linear> model(lin);
    model(at::randn({3, 4})).sum().backward();
    if (r == 1) {  // waits, as a rank gone on to its next step would
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag = true; }
    } done{rank0_done};
    save_checkpoint(dir.path(), *lin, nullptr, 0, 1);
  }, o);
  ASSERT_TRUE(is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  const std::string what = message_of(errors[0]);
  EXPECT_NE(what.find("in save_checkpoint"), std::string::npos) << what;
  EXPECT_NE(what.find("Checkpoint saving and loading is collective: every rank of the group "
                      "calls save_checkpoint"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("rank 1 has not reached it"), std::string::npos) << what;
  EXPECT_NE(what.find("in DDP backward (step "), std::string::npos) << what;
  EXPECT_FALSE(errors[1]) << message_of(errors[1]);
}

TEST(Checkpoint, ACrashBeforeTheRenameLeavesThePreviousCheckpoint) {
  TempDir dir;
  Net net;
  save_checkpoint(dir.path(), *net, nullptr, 1, 10);
  // What a writer killed between write and rename leaves: a partial
  // temporary file (and possibly the next model file).
  std::string full = detail::serialize_checkpoint(capture_checkpoint(*net, nullptr, 2, 20));
  std::string tmp = dir.file(".checkpoint-epoch000002-step000000000020.ddpckpt.tmp.4242");
  write_file(tmp, full.substr(0, full.size() / 2));
  auto ckpt = load_latest_checkpoint(dir.path());
  ASSERT_TRUE(ckpt);
  EXPECT_EQ(ckpt->epoch, 1);
  // The next save removes the leftover.
  save_checkpoint(dir.path(), *net, nullptr, 2, 20);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(load_latest_checkpoint(dir.path())->epoch, 2);
}

// A full disk (here: a file size limit that the model file fits and the
// checkpoint, carrying Adam's state, does not) fails the save naming the
// file and leaves no model file without its checkpoint.
TEST(Checkpoint, AFullDiskLeavesNoModelFileWithoutItsCheckpoint) {
  TempDir dir;
  Net net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  for (auto& p : net->parameters()) p.mutable_grad() = at::ones_like(p);
  adam.step();  // exp_avg and exp_avg_sq: the checkpoint is 3x the model
  TempDir sizes;
  save_checkpoint(sizes.path(), *net, &adam, 1, 1);
  const size_t model_bytes =
      fs::file_size(sizes.file("checkpoint-epoch000001-step000000000001.model.pt"));
  const size_t ckpt_bytes =
      fs::file_size(sizes.file("checkpoint-epoch000001-step000000000001.ddpckpt"));
  ASSERT_LT(model_bytes + 1024, ckpt_bytes);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = (model_bytes + ckpt_bytes) / 2;  // the model file fits, the checkpoint not
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() fails with EFBIG instead
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    save_checkpoint(dir.path(), *net, &adam, 1, 1);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find(".checkpoint-epoch000001-step000000000001.ddpckpt.tmp."), std::string::npos)
      << error;
  EXPECT_TRUE(fs::is_empty(dir.path())) << "left: " << fs::directory_iterator(dir.path())->path();
  // A model file orphaned by a crash between the renames goes at the next save.
  std::ofstream(dir.file("checkpoint-epoch000001-step000000000001.model.pt")) << "x";
  save_checkpoint(dir.path(), *net, &adam, 2, 2);
  EXPECT_FALSE(fs::exists(dir.file("checkpoint-epoch000001-step000000000001.model.pt")));
  EXPECT_TRUE(fs::exists(dir.file("checkpoint-epoch000002-step000000000002.model.pt")));
}

TEST(Checkpoint, TruncatedAndCorruptFilesNameTheFileAndTheProblem) {
  TempDir dir;
  Net net;
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  train(net, opt, 1);
  const std::string good = detail::serialize_checkpoint(capture_checkpoint(*net, &opt, 1, 1));
  const std::string path = dir.file("c.ddpckpt");
  struct Case { std::string bytes, expect; };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  std::string version = good;
  version[8] = 7;
  std::vector<Case> cases = {
      {"", "' is empty (0 bytes)"},
      {good.substr(0, 5), "is truncated or was not completely written (5 bytes"},
      {good.substr(0, 40), "is truncated or was not completely written (40 bytes"},
      {good.substr(0, good.size() - 1), "is truncated or was not completely written"},
      {"hello, I am a text file", "is not a ddp checkpoint"},
      {flipped, "is corrupt: CRC-32 of the payload is"},
      {version, "has format version 7; this build of ddp reads version 1"},
  };
  for (const Case& c : cases) {
    write_file(path, c.bytes);
    std::string msg = message_of_load(path);
    EXPECT_NE(msg.find("checkpoint '" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  EXPECT_NE(message_of_load(dir.file("absent")).find("No such file"), std::string::npos);
}

TEST(Checkpoint, EveryTruncationAndMutationIsAnInvalidArgument) {
  Net net(2);
  optim::Adam opt(net->parameters(), optim::AdamOptions(0.01).amsgrad(true));
  train(net, opt, 1);
  const std::string good = detail::serialize_checkpoint(capture_checkpoint(*net, &opt, 1, 1));
  for (size_t n = 0; n < good.size(); n += 7) {
    EXPECT_THROW(detail::parse_checkpoint(good.substr(0, n), "cut"), InvalidArgument) << n;
  }
  // Mutations with a valid CRC reach the field parser.
  std::mt19937 rng(5);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) {
      size_t at = 16 + rng() % (b.size() - 36);
      b[at] = static_cast<char>(rng() % 3 == 0 ? 0xff : rng());
    }
    refresh_crc(b);
    try {
      detail::parse_checkpoint(b, "mutant");
      ++parsed;  // a mutation inside tensor data is still a valid file
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint 'mutant'"), std::string::npos);
    }
  }
  EXPECT_GT(3000 - parsed, 300);  // many mutations hit the structure
}

TEST(Checkpoint, AnotherModelOrOptimizerIsRejectedAndNothingChanges) {
  Net net(3);
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  train(net, sgd, 1);
  Checkpoint ckpt = capture_checkpoint(*net, &sgd, 1, 1);
  ckpt.path = "/ckpt/x.ddpckpt";

  Net wider(5);
  Net wider_before(5);
  restore_checkpoint(capture_checkpoint(*wider, nullptr, 0, 0), *wider_before, nullptr);
  try {
    restore_checkpoint(ckpt, *wider, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "checkpoint '/ckpt/x.ddpckpt' does not fit this model: key "
                 "'fc1.weight' is float32[3, 4] in the checkpoint but float32[5, 4] "
                 "in the model (9 vs 9 tensors); load it into the model it was "
                 "saved from, or start without it");
  }
  expect_same_state(wider, wider_before);

  Net same(3);
  optim::Adam adam(same->parameters());
  try {
    restore_checkpoint(ckpt, *same, &adam);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("holds the state of an optimizer of "
                                         "type SGD, but the optimizer is of "
                                         "type Adam"),
              std::string::npos)
        << e.what();
  }
  // Without the optimizer it fits.
  RestoreOptions no_opt;
  no_opt.optimizer = false;
  restore_checkpoint(ckpt, *same, &adam, no_opt);
  expect_same_state(net, same);
}

TEST(Checkpoint, AWrappersModulePrefixIsDropped) {
  auto wrapper = std::make_shared<torch::nn::Module>();
  Net inner;
  wrapper->register_module("module", inner.ptr());
  Checkpoint ckpt = capture_checkpoint(*wrapper, nullptr, 0, 0);
  EXPECT_EQ(ckpt.model.keys().front(), "fc1.weight");
  Net bare;
  restore_checkpoint(ckpt, *bare, nullptr);
  expect_same_state(inner, bare);
}

TEST(Checkpoint, TwoRanksSaveOnceAndLoadTheSameFile) {
  TempDir dir;
  auto errors = run_ranks_collect(2, [&](int r) {
    Net net;
    std::string path = save_checkpoint(dir.path(), *net, nullptr, 4, 40);
    EXPECT_TRUE(fs::exists(path)) << "rank " << r;  // durable when it returns
    auto ckpt = load_latest_checkpoint(dir.path());
    ASSERT_TRUE(ckpt);
    EXPECT_EQ(ckpt->epoch, 4);
    EXPECT_EQ(ckpt->rng.size(), 2u);  // every rank's generator
  });
  for (const auto& e : errors) EXPECT_FALSE(e) << message_of(e);
}

TEST(Checkpoint, ASaveThatFailsOnRankZeroThrowsOnEveryRank) {
  TempDir dir;
  const std::string blocked = dir.file("file");
  write_file(blocked, "not a directory");
  auto errors = run_ranks_collect(2, [&](int) {
    Net net;
    save_checkpoint(blocked + "/ckpt", *net, nullptr, 1, 1);
  });
  EXPECT_NE(message_of(errors[0]).find("cannot create directory '" + blocked + "/ckpt'"),
            std::string::npos) << message_of(errors[0]);
  EXPECT_TRUE(is_a<InvalidArgument>(errors[1]));
  EXPECT_NE(message_of(errors[1]).find("rank 0 could not save checkpoint"),
            std::string::npos) << message_of(errors[1]);
}

// Reads one line from `fd` within `timeout_ms` ("" on timeout or EOF).
std::string read_line(int fd, int timeout_ms) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char c;
  while (line.empty() || line.back() != '\n') {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now()).count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0 || ::read(fd, &c, 1) != 1) return "";
    line += c;
  }
  return line;
}

// A real process saving checkpoints in a loop is killed with SIGKILL at
// random moments (often mid-write); every time, the latest checkpoint and
// every other listed one loads, and the epochs never go back.
TEST(CheckpointCrash, SigkillAtRandomMomentsLeavesALoadableLatest) {
  TempDir dir;
  const std::string writer = std::string(DDP_TEST_BIN_DIR) + "/tests/checkpoint_writer";
  std::mt19937 rng(11);
  int64_t last_epoch = 0;
  int killed_mid_write = 0;  // rounds that left a temporary file
  for (int round = 0; round < 12; ++round) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::string dir_arg = dir.path();
    char* argv[] = {const_cast<char*>(writer.c_str()), dir_arg.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(::posix_spawn(&pid, writer.c_str(), &actions, nullptr, argv, environ), 0)
        << writer;
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    std::string ready = read_line(out[0], 60000);
    // Kill while it keeps saving: 0-40 ms after its first save.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out[0]);
    ASSERT_EQ(ready.rfind("ready ", 0), 0u) << "round " << round << ": writer said '"
                                            << ready << "' (exit status " << status << ")";
    for (const auto& e : fs::directory_iterator(dir.path())) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) {
        ++killed_mid_write;
        break;
      }
    }
    auto ckpt = load_latest_checkpoint(dir.path());
    ASSERT_TRUE(ckpt.has_value());
    EXPECT_GE(ckpt->epoch, last_epoch);
    EXPECT_GE(ckpt->epoch, std::stoll(ready.substr(6)));
    last_epoch = ckpt->epoch;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      if (e.path().extension() == ".ddpckpt") {
        EXPECT_NO_THROW(load_checkpoint(e.path().string())) << e.path();
      }
    }
  }
  // Informational: how often the kill landed inside a write.
  std::printf("killed during a file write in %d of 12 rounds\n", killed_mid_write);
}

// The .model.pt file is a state dict for Python's torch.load.
TEST(Checkpoint, PythonTorchLoadReadsTheModelFile) {
  TempDir dir;
  at::manual_seed(2);
  Net net;
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1));
  train(net, opt, 2);
  std::string path = save_checkpoint(dir.path(), *net, &opt, 1, 2);
  std::string model_pt = path.substr(0, path.size() - 8) + ".model.pt";
  const std::string script = dir.file("load.py");
  write_file(script, R"(import sys, torch
sd = torch.load(sys.argv[1])
net = torch.nn.Module()
net.fc1 = torch.nn.Linear(4, 3)
net.bn = torch.nn.BatchNorm1d(3)
net.fc2 = torch.nn.Linear(3, 2)
net.load_state_dict(sd, strict=True)
for k, v in sd.items():
    vals = ",".join(float(x).hex() for x in v.double().flatten().tolist())
    print(k, str(v.dtype), list(v.shape), vals, sep="|")
)");
  if (!ddp::testing::oracle_configured()) GTEST_SKIP() << ddp::testing::kNoOracle;
  std::string cmd = ddp::testing::oracle_python() + " " + script + " " + model_pt + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = ::pclose(pipe);
  ASSERT_EQ(status, 0) << out;

  auto expected = net->named_parameters();
  for (const auto& b : net->named_buffers()) expected.insert(b.key(), b.value());
  std::istringstream lines(out);
  size_t seen = 0;
  for (std::string line; std::getline(lines, line); ++seen) {
    std::vector<std::string> f;
    std::istringstream cols(line);
    for (std::string c; std::getline(cols, c, '|');) f.push_back(c);
    ASSERT_EQ(f.size(), 4u) << line;
    ASSERT_TRUE(expected.contains(f[0])) << line;
    at::Tensor t = expected[f[0]].flatten().to(at::kDouble);
    std::istringstream vals(f[3]);
    int64_t i = 0;
    for (std::string v; std::getline(vals, v, ','); ++i) {
      ASSERT_LT(i, t.numel()) << f[0];
      EXPECT_EQ(std::strtod(v.c_str(), nullptr), t[i].item<double>()) << f[0] << "[" << i << "]";
    }
    EXPECT_EQ(i, t.numel()) << f[0];
  }
  EXPECT_EQ(seen, expected.size()) << out;
}

}  // namespace
}  // namespace ddp
