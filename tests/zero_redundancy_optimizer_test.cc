// ZeroRedundancyOptimizer: PyTorch's partition; after K steps the same
// parameters as the unsharded optimizer (SGD with momentum, Adam, AdamW)
// for W = 1..4; about 1/W of the optimizer state per rank; the full state
// consolidated, saved in a checkpoint and loaded exactly, at the same or
// another world size or into a plain optimizer; uneven inputs under join;
// errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace optim = torch::optim;

constexpr int64_t kGlobalBatch = 12;  // divides evenly over 1..4 ranks

enum class Kind { kSgd, kAdam, kAdamW };
const char* name_of(Kind k) { return k == Kind::kSgd ? "SGD" : k == Kind::kAdam ? "Adam" : "AdamW"; }

std::unique_ptr<optim::Optimizer> make_plain(Kind k, std::vector<at::Tensor> params) {
  if (k == Kind::kSgd) return std::make_unique<optim::SGD>(params, optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  if (k == Kind::kAdam) return std::make_unique<optim::Adam>(params, optim::AdamOptions(0.01));
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(0.01).weight_decay(0.05));
}

std::unique_ptr<ZeroRedundancyOptimizer> make_zero(Kind k, std::vector<at::Tensor> params) {
  if (k == Kind::kSgd) {
    return std::make_unique<ZeroRedundancyOptimizer>(params, optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  }
  if (k == Kind::kAdam) return std::make_unique<ZeroRedundancyOptimizer>(params, optim::AdamOptions(0.01));
  return std::make_unique<ZeroRedundancyOptimizer>(params, optim::AdamWOptions(0.01).weight_decay(0.05));
}

// Step `step`'s global batch; rank r of W takes rows [r*B/W, (r+1)*B/W), so
// DDP's average is the full batch's mean-loss gradient at every W.
std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(700 + step);
  at::Tensor x = torch::randn({kGlobalBatch, 8}, gen);
  at::Tensor y = torch::randn({kGlobalBatch, 4}, gen);
  const int64_t n = kGlobalBatch / world;
  return {x.narrow(0, rank * n, n), y.narrow(0, rank * n, n)};
}

Mlp initial() {
  torch::manual_seed(17);
  return Mlp();
}

struct ZeroRun {
  Kind kind = Kind::kAdam;
  int world = 2;
  bool zero = true;
  int first_step = 0, steps = 4;
  std::string save_dir;     // save a checkpoint after the steps
  std::string resume_from;  // restore this checkpoint first
  bool scheduler = false;   // StepLR(step_size 2, gamma 0.5)
};

// Trains from initial() (or a checkpoint); returns every rank's state.
std::vector<NamedState> train(const ZeroRun& run) {
  Mlp init = initial();
  std::vector<Mlp> models(run.world);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(run.world);
  run_ranks(run.world, [&](int r) {
    DistributedDataParallel<Mlp> model(models[r]);
    std::unique_ptr<optim::Optimizer> opt =
        run.zero ? make_zero(run.kind, model.parameters()) : make_plain(run.kind, model.parameters());
    if (!run.resume_from.empty()) {
      ddp::Checkpoint c = load_checkpoint(run.resume_from, at::kCPU);
      restore_checkpoint(c, *models[r], opt.get());
    }
    std::unique_ptr<optim::StepLR> lr;
    if (run.scheduler) lr = std::make_unique<optim::StepLR>(*opt, 2, 0.5);
    for (int s = run.first_step; s < run.first_step + run.steps; ++s) {
      auto [x, y] = batch(s, r, run.world);
      opt->zero_grad();
      torch::mse_loss(model(x), y).backward();
      opt->step();
      if (lr) lr->step();
    }
    if (!run.save_dir.empty()) save_checkpoint(run.save_dir, *models[r], opt.get(), 1, run.steps);
    states[r] = state_of(models[r]);
  });
  return states;
}

void expect_replicas_identical(const std::vector<NamedState>& states) {
  for (size_t r = 1; r < states.size(); ++r) EXPECT_EQ(max_diff(states[r], states[0]), 0.0) << "rank " << r;
}

TEST(ZeroRedundancyOptimizer, PartitionFollowsPyTorch) {
  // PyTorch: per group, largest first, each to the rank with the fewest
  // elements so far (ties: lowest rank), sizes carried across groups.
  auto t = [](int64_t n) { return torch::zeros({n}, torch::requires_grad()); };
  std::vector<at::Tensor> sizes = {t(10), t(30), t(20), t(30), t(5)};
  for (int world : {2, 3}) {
    std::vector<std::vector<std::vector<int>>> got(world);
    run_ranks(world, [&](int r) {
      ZeroRedundancyOptimizer opt(sizes, optim::SGDOptions(0.1));
      got[r] = opt.partition();
    });
    const std::vector<int> want = world == 2 ? std::vector<int>{1, 0, 0, 1, 1}
                                             : std::vector<int>{2, 0, 2, 1, 0};
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], std::vector<std::vector<int>>{want}) << world;
  }
  std::vector<std::vector<int>> two_groups;
  run_ranks(2, [&](int r) {
    std::vector<optim::OptimizerParamGroup> groups = {optim::OptimizerParamGroup({t(4), t(4)}),
                                                      optim::OptimizerParamGroup({t(8)})};
    ZeroRedundancyOptimizer opt(groups, optim::SGDOptions(0.1));
    if (r == 0) two_groups = opt.partition();
  });
  EXPECT_EQ(two_groups, (std::vector<std::vector<int>>{{0, 1}, {0}}));
}

TEST(ZeroRedundancyOptimizer, EqualsTheUnshardedOptimizer) {
  for (Kind kind : {Kind::kSgd, Kind::kAdam, Kind::kAdamW}) {
    for (int world = 1; world <= 4; ++world) {
      SCOPED_TRACE(std::string(name_of(kind)) + " on " + std::to_string(world) + " ranks");
      auto zero = train({kind, world, true});
      auto plain = train({kind, world, false});
      expect_replicas_identical(zero);
      EXPECT_EQ(max_diff(zero[0], plain[0]), 0.0);  // element-wise: bit for bit
      EXPECT_GT(max_diff(zero[0], state_of(initial())), 1e-3);  // it trained
    }
  }
}

// A scheduler changes param_groups()' lr; each step hands it to the shard.
TEST(ZeroRedundancyOptimizer, FollowsAnLrScheduler) {
  ZeroRun run{Kind::kSgd, 3, true, 0, 6};
  run.scheduler = true;
  auto zero = train(run);
  run.zero = false;
  auto plain = train(run);
  EXPECT_EQ(max_diff(zero[0], plain[0]), 0.0);
  run.scheduler = false;
  EXPECT_GT(max_diff(train(run)[0], plain[0]), 1e-4);  // the schedule mattered
}

// Linear(8, 4) has two parameters: on three ranks, rank 2 owns none and
// still takes part in every broadcast.
TEST(ZeroRedundancyOptimizer, ARankThatOwnsNothingStillTakesPart) {
  std::vector<NamedState> got[2];
  for (int use_zero = 0; use_zero < 2; ++use_zero) {
    torch::manual_seed(3);
    torch::nn::Linear init(8, 4);
    std::vector<torch::nn::Linear> models;
    for (int r = 0; r < 3; ++r) models.emplace_back(8, 4);
    for (auto& m : models) copy_state(init, m);
    got[use_zero].resize(3);
    run_ranks(3, [&](int r) {
      DistributedDataParallel<torch::nn::Linear> model(models[r]);
      auto opt = use_zero ? std::unique_ptr<optim::Optimizer>(make_zero(Kind::kAdam, model.parameters()))
                          : make_plain(Kind::kAdam, model.parameters());
      if (use_zero && r == 2) {
        EXPECT_EQ(static_cast<ZeroRedundancyOptimizer&>(*opt).state_bytes(), 0);
      }
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = batch(s, r, 3);
        opt->zero_grad();
        torch::mse_loss(model(x), y).backward();
        opt->step();
      }
      got[use_zero][r] = state_of(models[r]);
    });
  }
  expect_replicas_identical(got[1]);
  EXPECT_EQ(max_diff(got[1][0], got[0][0]), 0.0);
}

TEST(ZeroRedundancyOptimizer, EachRankHoldsItsShareOfTheState) {
  Mlp probe = initial();
  int64_t param_bytes = 0, largest = 0;
  for (const auto& p : probe->parameters()) {
    param_bytes += p.numel() * 4;
    largest = std::max<int64_t>(largest, p.numel() * 4);
  }
  for (int world : {1, 2, 4}) {
    std::vector<int64_t> bytes(world);
    Mlp init = initial();
    std::vector<Mlp> models(world);
    run_ranks(world, [&](int r) {
      copy_state(init, models[r]);
      DistributedDataParallel<Mlp> model(models[r]);
      ZeroRedundancyOptimizer opt(model.parameters(), optim::AdamOptions(0.01));
      auto [x, y] = batch(0, r, world);
      torch::mse_loss(model(x), y).backward();
      opt.step();
      bytes[r] = opt.state_bytes();
    });
    int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      total += bytes[r];
      // Adam: two moments per element; the greedy partition is within one
      // parameter of an even split.
      EXPECT_LE(bytes[r], 2 * (param_bytes / world + largest)) << "rank " << r << " of " << world;
    }
    EXPECT_EQ(total, 2 * param_bytes) << world;
  }
}

class ZeroCheckpoint : public ::testing::Test {
 protected:
  std::string latest() { return *latest_checkpoint_path(dir_.path()); }
  TempDir dir_{"ddp-zero"};
};

TEST_F(ZeroCheckpoint, ResumesExactlyAtTheSameWorldSize) {
  auto whole = train({Kind::kAdam, 2, true, 0, 6});
  train({Kind::kAdam, 2, true, 0, 3, dir_.path()});
  auto resumed = train({Kind::kAdam, 2, true, 3, 3, "", latest()});
  expect_replicas_identical(resumed);
  EXPECT_EQ(max_diff(resumed[0], whole[0]), 0.0);
}

// Saved by 2 ranks with ZeRO; resumed by 3 ranks with ZeRO, and by one
// process with a plain Adam: the same trajectory as one process throughout
// (up to float summation order across world sizes).
TEST_F(ZeroCheckpoint, ReshardsToAnotherWorldSizeOrAPlainOptimizer) {
  auto reference = train({Kind::kAdam, 1, false, 0, 6});
  train({Kind::kAdam, 2, true, 0, 3, dir_.path()});
  auto on_three = train({Kind::kAdam, 3, true, 3, 3, "", latest()});
  auto plain = train({Kind::kAdam, 1, false, 3, 3, "", latest()});
  expect_replicas_identical(on_three);
  EXPECT_LE(max_diff(on_three[0], reference[0]), 1e-5);
  EXPECT_LE(max_diff(plain[0], reference[0]), 1e-5);
  // Without the optimizer state the trajectory differs: the test can fail.
  ZeroRun fresh{Kind::kAdam, 1, false, 3, 3};
  auto cold = train(fresh);
  EXPECT_GT(max_diff(cold[0], reference[0]), 1e-3);
}

TEST(ZeroRedundancyOptimizer, StateDictOnlyWhereConsolidatedAndCurrent) {
  auto errors = run_ranks_collect(2, [&](int r) {
    Mlp net = initial();
    DistributedDataParallel<Mlp> model(net);
    ZeroRedundancyOptimizer opt(model.parameters(), optim::SGDOptions(0.1).momentum(0.9));
    auto [x, y] = batch(0, r, 2);
    torch::mse_loss(model(x), y).backward();
    opt.step();
    opt.consolidate_state_dict(1);
    if (r == 1) EXPECT_NE(opt.state_dict(), nullptr);
    torch::mse_loss(model(x), y).backward();
    opt.step();
    opt.state_dict();  // rank 1: stale; rank 0: never consolidated here
  });
  EXPECT_NE(message_of(errors[0]).find("the state was consolidated on rank 1, not on this rank "
                                       "(0): call state_dict() or torch::save there"),
            std::string::npos)
      << message_of(errors[0]);
  EXPECT_NE(message_of(errors[1]).find("step() ran after consolidate_state_dict()"), std::string::npos)
      << message_of(errors[1]);
}

// Uneven inputs: a finished rank shadows each step of the others, so every
// shard keeps being updated; the result equals a plain optimizer under join.
TEST(ZeroRedundancyOptimizer, UnevenInputsUnderJoin) {
  for (std::vector<int> batches : {std::vector<int>{3, 1}, {2, 4, 1}}) {
    const int world = static_cast<int>(batches.size());
    std::vector<NamedState> got[2];
    for (int use_zero = 0; use_zero < 2; ++use_zero) {
      Mlp init = initial();
      std::vector<Mlp> models(world);
      for (auto& m : models) copy_state(init, m);
      got[use_zero].resize(world);
      run_ranks(world, [&](int r) {
        DistributedDataParallel<Mlp> model(models[r]);
        auto opt = use_zero ? std::unique_ptr<optim::Optimizer>(make_zero(Kind::kSgd, model.parameters()))
                            : make_plain(Kind::kSgd, model.parameters());
        std::vector<JoinHook*> hooks;
        if (use_zero) hooks.push_back(static_cast<ZeroRedundancyOptimizer*>(opt.get()));
        join(model, hooks, [&] {
          for (int i = 0; i < batches[r]; ++i) {
            auto [x, y] = batch(i, 0, 3);  // each rank: a third of step i's batch
            opt->zero_grad();
            torch::mse_loss(model(x + r), y).backward();
            opt->step();
          }
        });
        got[use_zero][r] = state_of(models[r]);
      });
    }
    expect_replicas_identical(got[1]);
    EXPECT_LE(max_diff(got[1][0], got[0][0]), 1e-6) << batches.size() << " ranks";
  }
}

// With find_unused_parameters, a parameter no training rank uses gets no
// gradient on the finished rank either (not its own stale one), so its
// owner does not move it; and with gradient_as_bucket_view.
TEST(ZeroRedundancyOptimizer, UnevenInputsWithUnusedParametersAndBucketViews) {
  for (bool bucket_view : {false, true}) {
    std::vector<NamedState> got[2];
    for (int use_zero = 0; use_zero < 2; ++use_zero) {
      torch::manual_seed(8);
      Branchy init;
      std::vector<Branchy> models(2);
      for (auto& m : models) copy_state(init, m);
      got[use_zero].resize(2);
      run_ranks(2, [&](int r) {
        DistributedDataParallelOptions o;
        o.find_unused_parameters = true;
        o.gradient_as_bucket_view = bucket_view;
        DistributedDataParallel<Branchy> model(models[r], o);
        auto opt = use_zero ? std::unique_ptr<optim::Optimizer>(make_zero(Kind::kSgd, model.parameters()))
                            : make_plain(Kind::kSgd, model.parameters());
        std::vector<JoinHook*> hooks;
        if (use_zero) hooks.push_back(static_cast<ZeroRedundancyOptimizer*>(opt.get()));
        join(model, hooks, [&] {
          for (int i = 0; i < (r == 1 ? 1 : 4); ++i) {
            auto [x, y] = batch(i, r, 2);
            opt->zero_grad();
            // Rank 1's single step uses aux (rank 1 owns aux.weight);
            // afterwards nobody does.
            torch::mse_loss(model(x, r == 1), y).backward();
            opt->step();
          }
        });
        if (use_zero) {
          auto& zero = static_cast<ZeroRedundancyOptimizer&>(*opt);
          EXPECT_EQ(zero.partition()[0][4], 1);  // aux.weight: the finished rank's
        }
        got[use_zero][r] = state_of(models[r]);
      });
    }
    expect_replicas_identical(got[1]);
    EXPECT_LE(max_diff(got[1][0], got[0][0]), 1e-6) << "gradient_as_bucket_view " << bucket_view;
  }
}

// Groups with their own options, consolidated on rank 1, written by
// torch::save there and read by torch::load on every rank into a new
// optimizer: training goes on exactly as without the round trip.
TEST(ZeroRedundancyOptimizer, TorchSaveAndLoadRoundTripWithParameterGroups) {
  const TempDir dir("ddp-zero");
  const std::string file = dir.file("zero.pt");
  auto groups_of = [](DistributedDataParallel<Mlp>& model) {
    auto p = model.parameters();
    return std::vector<optim::OptimizerParamGroup>{
        optim::OptimizerParamGroup({p[0], p[1]}, std::make_unique<optim::AdamOptions>(0.02)),
        optim::OptimizerParamGroup(std::vector<at::Tensor>(p.begin() + 2, p.end()))};
  };
  std::vector<NamedState> got[2];
  for (int round_trip = 0; round_trip < 2; ++round_trip) {
    Mlp init = initial();
    std::vector<Mlp> models(2);
    for (auto& m : models) copy_state(init, m);
    got[round_trip].resize(2);
    run_ranks(2, [&](int r) {
      DistributedDataParallel<Mlp> model(models[r]);
      auto opt = std::make_unique<ZeroRedundancyOptimizer>(groups_of(model), optim::AdamOptions(0.005));
      for (int s = 0; s < 4; ++s) {
        if (s == 2 && round_trip) {
          opt->consolidate_state_dict(1);
          if (r == 1) torch::save(*opt, file);
          barrier();
          opt = std::make_unique<ZeroRedundancyOptimizer>(groups_of(model), optim::AdamOptions(0.005));
          torch::load(*opt, file);
        }
        auto [x, y] = batch(s, r, 2);
        opt->zero_grad();
        torch::mse_loss(model(x), y).backward();
        opt->step();
      }
      got[round_trip][r] = state_of(models[r]);
    });
  }
  expect_replicas_identical(got[1]);
  EXPECT_EQ(max_diff(got[1][0], got[0][0]), 0.0);
}

// A state whose entry for one parameter does not fit fails on every rank,
// not only on that parameter's owner (which would leave the others waiting
// at the next step).
TEST(ZeroRedundancyOptimizer, AStateThatDoesNotFitFailsOnEveryRank) {
  const TempDir dir("ddp-zero-bad");
  const std::string file = dir.file("zero.pt");
  auto errors = run_ranks_collect(2, [&](int r) {
    Mlp net = initial();
    auto params = net->parameters();
    ZeroRedundancyOptimizer opt(params, optim::AdamOptions(0.01));
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    opt.step();
    opt.consolidate_state_dict(0);
    if (r == 0) torch::save(opt, file);
    barrier();
    // The same element counts (so the same partition), one shape changed.
    std::vector<at::Tensor> other;
    for (auto& p : params) other.push_back(torch::zeros_like(p).requires_grad_());
    other[0] = torch::zeros({other[0].numel()}, torch::requires_grad());
    ZeroRedundancyOptimizer wrong(other, optim::AdamOptions(0.01));
    torch::load(wrong, file);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(is_a<InvalidArgument>(errors[r])) << message_of(errors[r]);
    EXPECT_NE(message_of(errors[r]).find("parameter 0"), std::string::npos) << message_of(errors[r]);
  }
}

TEST(ZeroRedundancyOptimizer, ParametersAddedAfterConstructionAreRefused) {
  auto a = torch::zeros({3}, torch::requires_grad());
  ZeroRedundancyOptimizer opt(std::vector<at::Tensor>{a}, optim::SGDOptions(0.1));
  opt.add_param_group(optim::OptimizerParamGroup({torch::zeros({2}, torch::requires_grad())}));
  try {
    opt.step();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameters were added after construction"), std::string::npos) << e.what();
  }
}

TEST(ZeroRedundancyOptimizer, BadParametersAreNamed) {
  auto a = torch::zeros({3}, torch::requires_grad());
  EXPECT_THROW(ZeroRedundancyOptimizer(std::vector<at::Tensor>{}, optim::SGDOptions(0.1)), InvalidArgument);
  try {
    ZeroRedundancyOptimizer(std::vector<at::Tensor>{a, a}, optim::SGDOptions(0.1));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1 of group 0 is listed twice"), std::string::npos) << e.what();
  }
  auto dup = run_ranks_collect(2, [&](int r) {  // one rank's bad list: every rank fails
    Mlp net = initial();
    auto params = net->parameters();
    if (r == 1) params.push_back(params[0]);
    ZeroRedundancyOptimizer opt(params, optim::SGDOptions(0.1));
  });
  EXPECT_NE(message_of(dup[0]).find("on rank 1: parameter 6 of group 0 is listed twice"), std::string::npos)
      << message_of(dup[0]);
  EXPECT_NE(message_of(dup[1]).find("ZeroRedundancyOptimizer: parameter 6 of group 0"), std::string::npos)
      << message_of(dup[1]);
  auto errors = run_ranks_collect(2, [&](int r) {
    Mlp net = initial();
    auto params = net->parameters();
    if (r == 1) params.pop_back();
    ZeroRedundancyOptimizer opt(params, optim::SGDOptions(0.1));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(is_a<MismatchError>(errors[r])) << message_of(errors[r]);
    EXPECT_NE(message_of(errors[r]).find("Every rank must pass the same parameters"), std::string::npos);
  }
  auto swapped = run_ranks_collect(2, [&](int r) {  // same counts, another order
    Mlp net = initial();
    auto params = net->parameters();
    if (r == 1) std::swap(params[0], params[1]);
    ZeroRedundancyOptimizer opt(params, optim::SGDOptions(0.1));
  });
  EXPECT_NE(message_of(swapped[0]).find("first difference at position 0: rank 0 has group 0 "
                                        "parameter 0: float32[16, 8] cpu, rank 1 has group 0 "
                                        "parameter 0: float32[16] cpu"),
            std::string::npos)
      << message_of(swapped[0]);
}

}  // namespace
}  // namespace ddp::testing
