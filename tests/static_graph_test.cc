// static_graph (Note [Static graph], reducer.h): the same values as without
// it and as one process, a gradient accumulated twice per backward (a
// re-entrant backward) reduced once, unused parameters without
// find_unused_parameters, and a changed graph named instead of wrong values.
// ddp_oracle_test compares static_graph with Python DDP's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

constexpr int kBatch = 4;

at::Tensor data(int step, int rank, int64_t cols) {
  at::Generator gen = at::detail::createCPUGenerator(500 + 31 * step + rank);
  return torch::randn({kBatch, cols}, gen);
}

struct TwiceRun {
  bool static_graph = false;
  bool checkpoint = false;
  bool checkpoint_head = false;
  CommHook hook;  // registered when set
  int world = 2;
  int steps = 4;
};

// Trains Twice from one seed; returns every rank's final state.
std::vector<NamedState> train_twice(const TwiceRun& s) {
  torch::manual_seed(5);
  Twice init(s.checkpoint, s.checkpoint_head);
  std::vector<Twice> models;
  for (int r = 0; r < s.world; ++r) models.emplace_back(s.checkpoint, s.checkpoint_head);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(s.world);
  run_ranks(s.world, [&](int r) {
    DistributedDataParallelOptions o;
    o.static_graph = s.static_graph;
    DistributedDataParallel<Twice> model(models[r], o);
    if (s.hook) model.register_comm_hook(s.hook, "under test");
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (int step = 0; step < s.steps; ++step) {
      opt.zero_grad();
      torch::mse_loss(model(data(step, r, 8)), data(step, r + 100, 4)).backward();
      opt.step();
    }
    states[r] = state_of(models[r]);
  });
  return states;
}

// One process on the concatenated batches, no checkpointing.
NamedState train_one_process(int world, int steps) {
  torch::manual_seed(5);
  Twice model;
  torch::optim::SGD opt(model->parameters(), 0.1);
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> xs, ys;
    for (int r = 0; r < world; ++r) {
      xs.push_back(data(step, r, 8));
      ys.push_back(data(step, r + 100, 4));
    }
    opt.zero_grad();
    torch::mse_loss(model(torch::cat(xs)), torch::cat(ys)).backward();
    opt.step();
  }
  return state_of(model);
}

TEST(StaticGraph, ModuleCalledTwiceEqualsOneProcessWithAndWithoutIt) {
  NamedState want = train_one_process(2, 4);
  for (bool on : {false, true}) {
    auto got = train_twice({on});
    expect_same_state(got[0], want, on ? "static_graph" : "dynamic", 1e-5);
    expect_same_state(got[1], got[0], "replicas", 0);
  }
}

TEST(StaticGraph, ReentrantBackwardReducesTheTwiceAccumulatedGradientOnce) {
  NamedState want = train_one_process(2, 4);
  auto got = train_twice({true, true});
  expect_same_state(got[0], want, "checkpointed, static_graph", 1e-5);
  expect_same_state(got[1], got[0], "replicas", 0);
}

// The head checkpointed too: the first parameter gradient arrives inside a
// nested backward, which must not end the outer one's reduction early.
TEST(StaticGraph, FirstGradientInsideACheckpointAndWithACommHook) {
  NamedState want = train_one_process(2, 4);
  TwiceRun s{true, true, true};
  auto got = train_twice(s);
  expect_same_state(got[0], want, "head checkpointed", 1e-5);
  s.checkpoint_head = false;
  s.hook = allreduce_hook;
  got = train_twice(s);
  expect_same_state(got[0], want, "with allreduce_hook", 1e-5);
  s.hook = fp16_compress_hook;
  got = train_twice(s);
  expect_same_state(got[1], got[0], "fp16 replicas", 0);
  EXPECT_LT(max_diff(got[0], want), 1e-2);
}

TEST(StaticGraph, ReentrantBackwardWithoutItNamesTheParameterAndTheWayOut) {
  try {
    train_twice({false, true});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    // block.weight or block.bias, whichever autograd accumulates first.
    EXPECT_NE(m.find("parameter 'block."), std::string::npos) << m;
    EXPECT_NE(m.find("got a second gradient in one backward"), std::string::npos) << m;
    EXPECT_NE(m.find("static_graph = true"), std::string::npos) << m;
  }
}

// Branchy's aux head: used on rank 1 only, or nowhere. static_graph needs no
// find_unused_parameters and gives find_unused_parameters' values.
std::vector<NamedState> train_branchy(bool static_graph, bool find_unused, int aux_rank,
                                      int change_at = -1) {
  torch::manual_seed(9);
  Branchy init;
  std::vector<Branchy> models(2);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(2);
  run_ranks(2, [&](int r) {
    DistributedDataParallelOptions o;
    o.static_graph = static_graph;
    o.find_unused_parameters = find_unused;
    DistributedDataParallel<Branchy> model(models[r], o);
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (int step = 0; step < 4; ++step) {
      const bool aux = (r == aux_rank) != (step == change_at);
      opt.zero_grad();
      torch::mse_loss(model(data(step, r, 8), aux), data(step, r + 100, 4)).backward();
      opt.step();
    }
    states[r] = state_of(models[r]);
  });
  return states;
}

TEST(StaticGraph, UnusedParametersNeedNoFindUnusedParameters) {
  for (int aux_rank : {1, -1}) {
    auto want = train_branchy(false, true, aux_rank);
    auto got = train_branchy(true, false, aux_rank);
    expect_same_state(got[0], want[0], "aux on rank " + std::to_string(aux_rank), 1e-6);
    expect_same_state(got[1], got[0], "replicas", 0);
  }
}

TEST(StaticGraph, AGraphThatChangesIsNamedNotSilentlyWrong) {
  // Rank 0 never uses aux, except at step 2: its graph changed.
  try {
    train_branchy(true, false, 1, 2);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("static_graph=true): the autograd graph of backward pass 2 differs from "
                     "the first iteration's on this rank"),
              std::string::npos) << m;
    EXPECT_NE(m.find("aux.weight: unused in the first iteration, now at least 1"),
              std::string::npos) << m;
  }
  // Rank 1 stops using aux at step 2: a parameter used in the first
  // iteration gets no gradient.
  try {
    train_branchy(true, false, 0, 2);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("aux.weight: 1 gradient(s) in the first iteration, now 0"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::testing
