// fully_shard: the shard layout equals torch.chunk's; each rank holds its
// chunk of every parameter (and only that between iterations); training
// with SGD (momentum, weight decay) and Adam at W = 1..4, resharding after
// forward or not, equals one process on the concatenated batch; gradient
// accumulation without sync, clip_grad_norm_, frozen parameters, evaluation
// without grad; full state dicts across world sizes; errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "fsdp/shard_layout.h"
#include "support/expect_error.h"
#include "support/fsdp_net.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace nn = torch::nn;
namespace optim = torch::optim;
using fsdp_net::batch;
using fsdp_net::Block;
using fsdp_net::initial_values;
using fsdp_net::kGlobalBatch;
using fsdp_net::model_like;
using fsdp_net::Net;
using fsdp_net::shard;

enum class Opt { kSgd, kAdam };

std::unique_ptr<optim::Optimizer> make_optimizer(Opt o, std::vector<at::Tensor> params) {
  if (o == Opt::kSgd) {
    return std::make_unique<optim::SGD>(params,
                                        optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  }
  return std::make_unique<optim::Adam>(params, optim::AdamOptions(0.01));
}

struct TrainSpec {
  Opt opt = Opt::kSgd;
  int steps = 3;
  int micro_steps = 1;       // backward passes per step; the first ones without sync
  double clip = 0;           // > 0: clip_grad_norm_ to this before each step
  bool freeze_b1_fc1 = false;
};

void freeze(Net& net) {
  for (auto& p : net->b1->fc1->parameters()) p.set_requires_grad(false);
}

// One process on the whole batch: what every W must reproduce.
std::map<std::string, at::Tensor> train_single(const TrainSpec& s,
                                               std::vector<double>* norms = nullptr) {
  Net net = model_like(initial_values());
  if (s.freeze_b1_fc1) freeze(net);
  auto opt = make_optimizer(s.opt, net->parameters());
  for (int step = 0; step < s.steps; ++step) {
    opt->zero_grad();
    for (int m = 0; m < s.micro_steps; ++m) {
      auto [x, y] = batch(step * 10 + m, 0, 1);
      torch::mse_loss(net(x), y).backward();
    }
    if (s.clip > 0) {
      double n = nn::utils::clip_grad_norm_(net->parameters(), s.clip);
      if (norms) norms->push_back(n);
    }
    opt->step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// Rank `rank` of `world` trains the sharded model; returns the full state.
std::map<std::string, at::Tensor> train_sharded(const TrainSpec& s, int rank, int world,
                                                bool reshard_after_forward,
                                                std::vector<double>* norms = nullptr) {
  Net net = model_like(initial_values());
  if (s.freeze_b1_fc1) freeze(net);
  shard(net, reshard_after_forward);
  auto opt = make_optimizer(s.opt, net->parameters());
  for (int step = 0; step < s.steps; ++step) {
    opt->zero_grad();
    for (int m = 0; m < s.micro_steps; ++m) {
      set_requires_gradient_sync(*net, m == s.micro_steps - 1);
      auto [x, y] = batch(step * 10 + m, rank, world);
      torch::mse_loss(net(x), y).backward();
    }
    if (s.clip > 0) {
      double n = clip_grad_norm_(*net, s.clip);
      if (norms) norms->push_back(n);
    }
    opt->step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : full_state_dict(*net)) out[kv.key()] = kv.value();
  return out;
}

void expect_same(const std::map<std::string, at::Tensor>& got,
                 const std::map<std::string, at::Tensor>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << where << ": " << name;
    const at::Tensor& g = got.at(name);
    ASSERT_EQ(g.sizes(), w.sizes()) << where << ": " << name;
    EXPECT_TRUE(torch::allclose(g, w, 1e-5, 1e-6))
        << where << ": " << name << " differs by " << (g - w).abs().max().item<double>();
  }
}

TEST(FullyShardLayout, CutsDimZeroAsTorchChunkDoes) {
  for (int64_t rows : {1, 2, 3, 5, 7, 8, 13}) {
    for (int world = 1; world <= 5; ++world) {
      at::Tensor t = torch::arange(rows * 2).view({rows, 2});
      std::vector<at::Tensor> chunks = at::chunk(t, world, 0);
      for (int r = 0; r < world; ++r) {
        auto layout = detail::unit_shard_layout({{rows, 2}, {rows}}, r, world);
        const detail::ParamShard& p = layout.params[0];
        // torch.chunk returns fewer chunks when they run out; FSDP2 then
        // gives the remaining ranks empty shards.
        const int64_t want_rows = r < static_cast<int>(chunks.size()) ? chunks[r].size(0) : 0;
        EXPECT_EQ(p.local_rows, want_rows) << rows << " rows, rank " << r << " of " << world;
        EXPECT_EQ(p.shard_sizes, (std::vector<int64_t>{want_rows, 2}));
        EXPECT_EQ(layout.params[1].offset, p.padded_numel());
        EXPECT_EQ(layout.shard_numel, p.chunk_rows * 3);
        if (want_rows > 0) {
          EXPECT_EQ(r * p.chunk_rows, chunks[r][0][0].item<int64_t>() / 2);
        }
      }
    }
  }
}

TEST(FullyShard, EachRankHoldsItsChunkOfEveryParameter) {
  const auto values = initial_values();
  for (int world = 1; world <= 4; ++world) {
    run_ranks(world, [&](int rank) {
      Net net = model_like(values);
      shard(net);
      int64_t held = 0;
      for (const auto& p : net->named_parameters()) {
        const at::Tensor& full = values.at(p.key());
        std::vector<at::Tensor> chunks = at::chunk(full, world, 0);
        at::Tensor want = rank < static_cast<int>(chunks.size())
                              ? chunks[rank]
                              : full.narrow(0, 0, 0);
        ASSERT_EQ(p.value().sizes(), want.sizes()) << p.key() << " rank " << rank;
        EXPECT_TRUE(torch::equal(p.value(), want)) << p.key();
        held += p.value().numel();
      }
      int64_t total = 0;
      for (const auto& [name, v] : values) total += v.numel();
      EXPECT_LE(held, total / world + 40) << "rank " << rank << " of " << world;
    });
  }
}

TEST(FullyShard, InnerUnitsReshardAfterForwardAndAllAfterBackward) {
  const auto values = initial_values();
  run_ranks(2, [&](int rank) {
    Net net = model_like(values);
    shard(net);
    auto [x, y] = batch(0, rank, 2);
    at::Tensor loss = torch::mse_loss(net(x), y);
    // Between forward and backward: the blocks are shards again, the root
    // (whose backward comes first) stays gathered, as FSDP2's root does.
    EXPECT_EQ(net->b1->fc1->weight.size(0), rank == 0 ? 4 : 3);  // 7 rows
    EXPECT_EQ(net->inp->weight.size(0), 5);
    loss.backward();
    EXPECT_EQ(net->inp->weight.size(0), rank == 0 ? 3 : 2);
    EXPECT_EQ(net->inp->weight.grad().sizes(), net->inp->weight.sizes());
    EXPECT_EQ(net->b2->fc1->weight.grad().size(0), rank == 0 ? 2 : 1);
  });
}

class FullyShardTraining
    : public ::testing::TestWithParam<std::tuple<int, Opt, bool>> {};

TEST_P(FullyShardTraining, EqualsOneProcessOnTheWholeBatch) {
  const auto [world, opt, reshard] = GetParam();
  TrainSpec spec;
  spec.opt = opt;
  const auto want = train_single(spec);
  run_ranks(world, [&](int rank) {
    expect_same(train_sharded(spec, rank, world, reshard), want,
                "rank " + std::to_string(rank) + " of " + std::to_string(world));
  });
}

INSTANTIATE_TEST_SUITE_P(
    WorldsOptimizersReshard, FullyShardTraining,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(Opt::kSgd, Opt::kAdam),
                       ::testing::Bool()),
    [](const auto& info) {
      return "W" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) == Opt::kSgd ? "_SGD" : "_Adam") +
             (std::get<2>(info.param) ? "_reshard" : "_keep");
    });

TEST(FullyShard, AccumulatesWithoutSyncThenReducesTheSum) {
  TrainSpec spec;
  spec.micro_steps = 3;
  const auto want = train_single(spec);
  for (int world : {2, 3}) {
    run_ranks(world, [&](int rank) {
      expect_same(train_sharded(spec, rank, world, true), want, "W=" + std::to_string(world));
    });
  }
}

TEST(FullyShard, ClipGradNormUsesTheWholeModelsNorm) {
  TrainSpec spec;
  spec.clip = 0.05;  // below the gradients' norm: every step clips
  std::vector<double> want_norms;
  const auto want = train_single(spec, &want_norms);
  run_ranks(3, [&](int rank) {
    std::vector<double> norms;
    expect_same(train_sharded(spec, rank, 3, true, &norms), want, "W=3");
    ASSERT_EQ(norms.size(), want_norms.size());
    for (size_t i = 0; i < norms.size(); ++i) {
      EXPECT_NEAR(norms[i], want_norms[i], 1e-5 * want_norms[i]);
      EXPECT_GT(norms[i], spec.clip);
    }
  });
}

TEST(FullyShard, FrozenParametersStayAndTheRestTrains) {
  TrainSpec spec;
  spec.freeze_b1_fc1 = true;
  spec.opt = Opt::kAdam;
  const auto want = train_single(spec);
  const auto initial = initial_values();
  EXPECT_TRUE(torch::equal(want.at("b1.fc1.weight"), initial.at("b1.fc1.weight")));
  run_ranks(2, [&](int rank) { expect_same(train_sharded(spec, rank, 2, true), want, "W=2"); });
}

TEST(FullyShard, EvaluatesWithoutGradAndReshards) {
  const auto values = initial_values();
  Net ref = model_like(values);
  auto [x, y] = batch(0, 0, 1);
  at::Tensor want = ref(x).detach();
  run_ranks(3, [&](int rank) {
    Net net = model_like(values);
    shard(net);
    torch::NoGradGuard no_grad;
    at::Tensor out = net(x);
    EXPECT_TRUE(torch::allclose(out, want, 1e-6, 1e-7));
    EXPECT_EQ(net->inp->weight.size(0), rank < 2 ? 2 : 1);  // root resharded too
  });
}

TEST(FullyShard, FullStateDictLoadsIntoAnotherWorldSize) {
  TrainSpec spec;
  const auto trained = train_single(spec);
  torch::OrderedDict<std::string, at::Tensor> state;
  for (const auto& [k, v] : trained) state.insert(k, v);
  run_ranks(3, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    load_full_state_dict(*net, state);
    std::map<std::string, at::Tensor> got;
    for (const auto& kv : full_state_dict(*net)) got[kv.key()] = kv.value();
    expect_same(got, trained, "rank " + std::to_string(rank));
  });
}

TEST(FullyShard, Errors) {
  run_ranks(2, [&](int) {
    Net net;
    expect_error([&] { fully_shard(net); }, "its unit 'b1' is not sharded yet");
    shard(net);
    expect_error([&] { fully_shard(net); }, "sharded already");

    torch::OrderedDict<std::string, at::Tensor> bad;
    bad.insert("inp.weight", torch::zeros({2, 2}));
    expect_error([&] { load_full_state_dict(*net, bad); },
                 "'inp.weight' is [2, 2] in the state dict but the model's is [5, 6]");
    expect_error([&] { load_full_state_dict(*net, torch::OrderedDict<std::string, at::Tensor>()); },
                 "'inp.weight' is missing in the state dict");

    // A forward without backward leaves the root gathered; a change made
    // to it then would be lost at the next gather.
    auto [x, y] = batch(0, 0, 2);
    at::Tensor loss = torch::mse_loss(net(x), y);
    {
      torch::NoGradGuard no_grad;
      net->inp->weight.add_(1.0);
    }
    expect_error([&] { reshard(*net); }, "'inp.weight' was changed in place while gathered");
  });
}

TEST(FullyShard, AParameterWhoseDataWasReplacedIsNamed) {
  run_ranks(2, [&](int rank) {
    Net net = model_like(initial_values());
    shard(net);
    net->to(at::kDouble);  // replaces every parameter's data
    auto [x, y] = batch(0, rank, 2);
    expect_error([&] { net(x.to(at::kDouble)); },
                 "parameter 'inp.weight' no longer holds its shard");
  });
}

TEST(FullyShard, AStepOnGatheredParametersFailsInsteadOfSkippingThem) {
  const auto values = initial_values();
  run_ranks(2, [&](int rank) {
    Net net = model_like(values);
    shard(net);
    auto opt = make_optimizer(Opt::kSgd, net->parameters());
    auto [x, y] = batch(0, rank, 2);
    torch::mse_loss(net(x), y).backward();
    at::Tensor validation = torch::mse_loss(net(x), y);  // grad mode, no backward
    EXPECT_THROW(opt->step(), c10::Error);  // the root's shard grads vs its full values
    reshard(*net);
    at::Tensor before = net->inp->weight.detach().clone();
    opt->step();
    EXPECT_FALSE(torch::equal(net->inp->weight, before));
  });
}

struct MatmulImpl : nn::Module {
  explicit MatmulImpl(at::Tensor w) : weight(register_parameter("weight", std::move(w))) {}
  at::Tensor forward(at::Tensor x) { return x.matmul(weight); }
  at::Tensor weight;
};

struct TiedImpl : nn::Module {
  explicit TiedImpl(at::Tensor w)
      : a(register_module("a", FullyShard<MatmulImpl>(w))),
        b(register_module("b", FullyShard<MatmulImpl>(w))),
        head(register_parameter("head", w)) {}
  at::Tensor forward(at::Tensor x) { return b(a(x)).matmul(head); }
  FullyShard<MatmulImpl> a, b;
  at::Tensor head;
};

struct TiedOutsideImpl : nn::Module {
  explicit TiedOutsideImpl(at::Tensor w)
      : a(register_module("a", FullyShard<MatmulImpl>(w))), head(register_parameter("head", w)) {}
  at::Tensor forward(at::Tensor x) { return a(x).matmul(head); }
  FullyShard<MatmulImpl> a;
  at::Tensor head;
};

TEST(FullyShard, RefusesAParameterSharedByTwoUnits) {
  run_ranks(1, [&](int) {
    FullyShard<TiedImpl> tied(torch::randn({4, 4}));
    fully_shard(tied->a);
    expect_error([&] { fully_shard(tied->b); },
                 "fully_shard(MatmulImpl): parameter 'weight' is sharded already by unit "
                 "MatmulImpl");
    FullyShard<TiedOutsideImpl> outside(torch::randn({4, 4}));
    fully_shard(outside->a);
    expect_error([&] { fully_shard(outside); },
                 "fully_shard(TiedOutsideImpl): parameter 'head' is the same tensor as 'a.weight' "
                 "of an inner unit");
  });
}

}  // namespace
}  // namespace ddp::testing
