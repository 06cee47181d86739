// fully_shard and checkpoints: the optimizer's state in full
// (full_optimizer_state_dict) equals the unsharded optimizer's; a
// checkpoint saved sharded on 2 ranks continues on 3 ranks sharded, and in
// one process unsharded, to the values of one process that never stopped;
// a checkpoint of the unsharded model continues sharded; errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "support/expect_error.h"
#include "support/fsdp_net.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace optim = torch::optim;
using fsdp_net::batch;
using fsdp_net::initial_values;
using fsdp_net::model_like;
using fsdp_net::Net;
using fsdp_net::shard;
using fsdp_net::train_steps;

constexpr int kSteps = 4;


std::unique_ptr<optim::Adam> adam(const Net& net) {
  return std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions(0.01));
}

std::map<std::string, at::Tensor> values(const torch::OrderedDict<std::string, at::Tensor>& d) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : d) out[kv.key()] = kv.value();
  return out;
}

std::map<std::string, at::Tensor> values(const Net& net) {
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : net->named_parameters()) out[kv.key()] = kv.value().detach().clone();
  return out;
}

void expect_close(const std::map<std::string, at::Tensor>& got,
                  const std::map<std::string, at::Tensor>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << where << ": " << name;
    EXPECT_TRUE(torch::allclose(got.at(name), w, 1e-5, 1e-6))
        << where << ": " << name << " differs by "
        << (got.at(name) - w).abs().max().item<double>();
  }
}

// The Adam moments of every parameter, by the parameter's index.
std::vector<at::Tensor> moments(const OptimizerState& s) {
  std::vector<at::Tensor> out;
  for (const auto& g : s.groups) {
    for (const auto& st : g.state) {
      for (const OptimizerField& f : *st) {
        if (f.name == "exp_avg" || f.name == "exp_avg_sq") out.push_back(f.tensor);
      }
    }
  }
  return out;
}

std::map<std::string, at::Tensor> uninterrupted() {
  Net net = model_like(initial_values());
  auto opt = adam(net);
  train_steps(net, *opt, 0, kSteps, 0, 1);
  return values(net);
}

TEST(FullyShardCheckpoint, FullOptimizerStateEqualsTheUnshardedOptimizers) {
  Net single = model_like(initial_values());
  auto single_opt = adam(single);
  train_steps(single, *single_opt, 0, 2, 0, 1);
  const Checkpoint saved = capture_checkpoint(*single, single_opt.get(), 0, 2);
  const std::vector<at::Tensor> want = moments(*saved.optimizer);
  run_ranks(3, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    train_steps(net, *opt, 0, 2, rank, 3);
    const std::vector<at::Tensor> got = moments(full_optimizer_state_dict(*net, *opt));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].sizes(), want[i].sizes()) << "moment " << i;
      EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-7)) << "moment " << i;
    }
  });
}

// Saved by 2 ranks sharded after 2 steps; continued on 3 ranks sharded and
// in one process unsharded: both end where one process that never stopped
// ends (the shards of the moments were cut anew, the step counts kept).
TEST(FullyShardCheckpoint, ContinuesOnAnyWorldSizeShardedOrNot) {
  const auto want = uninterrupted();
  const TempDir tmp("fsdp-ckpt");
  const std::string dir = tmp.path();
  run_ranks(2, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    train_steps(net, *opt, 0, 2, rank, 2);
    save_checkpoint(dir, *net, opt.get(), 0, 2);
  });
  run_ranks(3, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    auto ckpt = load_latest_checkpoint(dir);
    ASSERT_TRUE(ckpt.has_value());
    restore_checkpoint(*ckpt, *net, opt.get());
    train_steps(net, *opt, 2, kSteps, rank, 3);
    expect_close(values(full_state_dict(*net)), want, "3 ranks, rank " + std::to_string(rank));
  });
  Net plain = model_like(initial_values());
  auto opt = adam(plain);
  const Checkpoint ckpt = load_checkpoint(*latest_checkpoint_path(dir));
  EXPECT_EQ(ckpt.model.find("b1.fc1.weight")->sizes(), plain->b1->fc1->weight.sizes());
  restore_checkpoint(ckpt, *plain, opt.get());
  train_steps(plain, *opt, 2, kSteps, 0, 1);
  expect_close(values(plain), want, "one process");
}

TEST(FullyShardCheckpoint, AnUnshardedCheckpointContinuesSharded) {
  const auto want = uninterrupted();
  Net plain = model_like(initial_values());
  auto plain_opt = adam(plain);
  train_steps(plain, *plain_opt, 0, 1, 0, 1);
  const Checkpoint saved = capture_checkpoint(*plain, plain_opt.get(), 0, 1);
  run_ranks(4, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    restore_checkpoint(saved, *net, opt.get(), RestoreOptions{true, false, rank});
    train_steps(net, *opt, 1, kSteps, rank, 4);
    expect_close(values(full_state_dict(*net)), want, "4 ranks, rank " + std::to_string(rank));
  });
}

TEST(FullyShardCheckpoint, Errors) {
  const TempDir tmp("fsdp-ckpt");
  const std::string dir = tmp.path();
  auto errors = run_ranks_collect(2, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    expect_error([&] { capture_checkpoint(*net, opt.get(), 0, 0); },
                 "the model is sharded (fully_shard), and this rank holds only its shards");
    expect_error([&] { save_checkpoint(dir, *net->b1, nullptr, 0, 0); },
                 "sits inside another unit: pass the root unit");
    // Rank 1 stepped, rank 0 did not: the gathers would not line up.
    auto [x, y] = batch(0, rank, 2);
    torch::mse_loss(net(x), y).backward();
    if (rank == 1) opt->step();
    full_optimizer_state_dict(*net, *opt);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(is_a<MismatchError>(errors[r])) << message_of(errors[r]);
    EXPECT_NE(message_of(errors[r]).find("rank 1's optimizer state differs from rank 0's at "
                                         "'inp.weight'"),
              std::string::npos)
        << message_of(errors[r]);
  }
  Net plain;
  auto sgd = std::make_unique<optim::SGD>(plain->parameters(), optim::SGDOptions(0.1));
  run_ranks(2, [&](int) {
    Net net = model_like(initial_values());
    shard(net);
    auto opt = adam(net);
    const Checkpoint other = capture_checkpoint(*plain, sgd.get(), 0, 0);
    expect_error([&] { restore_checkpoint(other, *net, opt.get()); }, "of type SGD");
  });
}

}  // namespace
}  // namespace ddp::testing
