// Sharded checkpoints (ddp/sharded_checkpoint.h): each rank's file holds
// only its shards; saved by 2 ranks, loaded by 3 and by 1, training goes on
// to the values of one process that never stopped (parameters and Adam's
// moments cut anew); keep_last prunes; a set without its index is not
// listed; a missing rank file, a full checkpoint given as an index, and
// another model are named on every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "ddp/checkpoint.h"
#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "ddp/sharded_checkpoint.h"
#include "support/expect_error.h"
#include "support/fsdp_net.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace fs = std::filesystem;
namespace optim = torch::optim;
using fsdp_net::batch;
using fsdp_net::initial_values;
using fsdp_net::model_like;
using fsdp_net::Net;
using fsdp_net::shard;
using fsdp_net::train_steps;

constexpr int kSteps = 4;

std::map<std::string, at::Tensor> uninterrupted() {
  Net net = model_like(initial_values());
  optim::Adam opt(net->parameters(), optim::AdamOptions(0.01));
  train_steps(net, opt, 0, kSteps, 0, 1);
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : net->named_parameters()) out[kv.key()] = kv.value().detach().clone();
  return out;
}

// 2 ranks train 2 steps and save; returns the index.
std::string save_after_two_steps(const std::string& dir, int keep_last = 0) {
  std::string index;
  run_ranks(2, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    optim::Adam opt(net->parameters(), optim::AdamOptions(0.01));
    train_steps(net, opt, 0, 2, rank, 2);
    ShardedSaveOptions o;
    o.keep_last = keep_last;
    o.metadata["note"] = "two steps";
    const std::string path = save_sharded_checkpoint(dir, *net, &opt, 0, 2, o);
    if (rank == 0) index = path;
  });
  return index;
}

TEST(ShardedCheckpoint, SavedByTwoRanksContinuesOnThreeAndOnOne) {
  const auto want = uninterrupted();
  const TempDir dir("fsdp-sharded");
  const std::string index = save_after_two_steps(dir.path());
  EXPECT_EQ(fs::path(index).filename(), "checkpoint-epoch000000-step000000000002.ddpshards");
  EXPECT_EQ(latest_sharded_checkpoint_path(dir.path()), index);
  // Rank 0's file: 4 of b1.fc1.weight's 7 rows (torch.chunk at W=2).
  const Checkpoint part = load_checkpoint(
      dir.path() + "/checkpoint-epoch000000-step000000000002.shards/rank-0.ddpckpt");
  EXPECT_EQ(part.model.find("b1.fc1.weight")->size(0), 4);
  for (int world : {3, 1}) {
    run_ranks(world, [&](int rank) {
      Net net = model_like(initial_values());
      shard(net);
      optim::Adam opt(net->parameters(), optim::AdamOptions(0.01));
      const ShardedCheckpointInfo info = load_sharded_checkpoint(index, *net, &opt);
      EXPECT_EQ(info.step, 2);
      EXPECT_EQ(info.world_size, 2);
      EXPECT_EQ(info.metadata.at("note"), "two steps");
      train_steps(net, opt, 2, kSteps, rank, world);
      for (const auto& kv : full_state_dict(*net)) {
        const at::Tensor& w = want.at(kv.key());
        EXPECT_TRUE(torch::allclose(kv.value(), w, 1e-5, 1e-6))
            << "W=" << world << " rank " << rank << " " << kv.key() << " differs by "
            << (kv.value() - w).abs().max().item<double>();
      }
    });
  }
}

TEST(ShardedCheckpoint, KeepLastPrunesAndASetWithoutItsIndexIsNotListed) {
  const TempDir dir("fsdp-sharded");
  run_ranks(2, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    ShardedSaveOptions o;
    o.keep_last = 2;
    for (int step = 1; step <= 3; ++step) save_sharded_checkpoint(dir.path(), *net, nullptr, 0, step, o);
    (void)rank;
  });
  const std::string stem = dir.path() + "/checkpoint-epoch000000-step00000000000";
  EXPECT_FALSE(fs::exists(stem + "1.ddpshards"));
  EXPECT_FALSE(fs::exists(stem + "1.shards"));
  EXPECT_TRUE(fs::exists(stem + "2.shards/rank-1.ddpckpt"));
  EXPECT_EQ(latest_sharded_checkpoint_path(dir.path()), stem + "3.ddpshards");
  fs::remove(stem + "3.ddpshards");  // as a crash before the index leaves it
  EXPECT_EQ(latest_sharded_checkpoint_path(dir.path()), stem + "2.ddpshards");
}

TEST(ShardedCheckpoint, ErrorsAreNamedOnEveryRank) {
  const TempDir dir("fsdp-sharded");
  const std::string index = save_after_two_steps(dir.path());
  const std::string shards = dir.path() + "/checkpoint-epoch000000-step000000000002.shards";
  fs::remove(shards + "/rank-1.ddpckpt");
  auto errors = run_ranks_collect(2, [&](int) {
    Net net = model_like(initial_values());
    shard(net);
    load_sharded_checkpoint(index, *net, nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(message_of(errors[r]).find("rank-1.ddpckpt"), std::string::npos)
        << message_of(errors[r]);
  }
  run_ranks(2, [&](int) {
    Net net = model_like(initial_values());
    shard(net);
    const std::string full = save_checkpoint(dir.path(), *net, nullptr, 0, 0);
    expect_error([&] { load_sharded_checkpoint(full, *net, nullptr); },
                 "is not the index of a sharded checkpoint");
  });
}

// Another model (other shapes) saved under the same names.
struct WideImpl : torch::nn::Module {
  WideImpl() : inp(register_module("inp", torch::nn::Linear(6, 9))) {}
  at::Tensor forward(const at::Tensor& x) { return inp(x); }
  torch::nn::Linear inp;
};

TEST(ShardedCheckpoint, AnotherModelIsNamed) {
  const TempDir dir("fsdp-sharded");
  std::string index;
  run_ranks(2, [&](int rank) {
    FullyShard<WideImpl> wide;
    fully_shard(wide);
    const std::string p = save_sharded_checkpoint(dir.path(), *wide, nullptr, 0, 0);
    if (rank == 0) index = p;
  });
  run_ranks(2, [&](int) {
    Net net = model_like(initial_values());
    shard(net);
    expect_error([&] { load_sharded_checkpoint(index, *net, nullptr); },
                 "holds 'inp.weight' as [5, 6], but rank 0 of 2 holds [3, 6] of this model's");
  });
}

}  // namespace
}  // namespace ddp::testing
