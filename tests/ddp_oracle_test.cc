// PyTorch's Python DistributedDataParallel as an oracle: the same scenarios
// (initial weights written by this test, the same data, the same options)
// trained by tests/oracle/ddp_oracle.py on 2 processes and by ddp on 2 ranks
// must end with the same parameters and buffers within 1e-6.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include <torch/version.h>

#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/join.h"
#include "ddp/powersgd.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

using json = nlohmann::json;

constexpr int kWorld = 2;
constexpr int kBatch = 4;
constexpr int kSteps = 4;

// One scenario, written with designated initialisers ({.model = "mlp",
// .accumulate = 2}: C++20's, which GCC and Clang accept in this project's
// C++17 builds too), the fields named in this order.
struct Scenario {
  std::string model;  // "mlp", "bncnn", "branchy"
  int64_t in = 8;
  bool find_unused = false;
  bool bucket_view = false;
  int accumulate = 1;
  int aux_rank = -1;  // branchy: the rank whose forward uses the aux head
  std::vector<int> rank_steps;  // uneven inputs under join: steps per rank
  bool divide_by_initial = true;
  int aux_micro = -1;  // branchy: the micro-step using aux (-1: all)
  std::string comm_hook;  // a built-in hook's PyTorch name, or "" for none
  bool static_graph = false;
  // Compression hooks: one float32 ulp of difference in a gradient (Python's
  // and libtorch's kernels may sum in another order) can move its float16
  // rounding by one float16 ulp (about 1e-4 relative), which SGD's step
  // (lr 0.1) turns into ~1e-5 in a parameter. bfloat16's ulp is 8x larger.
  double atol() const {
    if (comm_hook.rfind("fp16", 0) == 0) return 1e-4;
    if (comm_hook.rfind("bf16", 0) == 0) return 1e-3;
    if (comm_hook.find("powerSGD") != std::string::npos) return 1e-5;
    return 1e-6;
  }
};

// "powerSGD rank=R [same_shape]" / "batched_powerSGD rank=R": a fresh
// state per call (per rank), start_powerSGD_iter 2, seed 0.
CommHook powersgd_named(const std::string& name) {
  PowerSGDOptions o;
  o.start_powerSGD_iter = 2;
  o.matrix_approximation_rank = std::stoi(name.substr(name.find("rank=") + 5));
  o.batch_tensors_with_same_shape = name.find("same_shape") != std::string::npos;
  auto state = std::make_shared<PowerSGDState>(o);
  if (name.rfind("batched", 0) == 0) {
    return [state](GradBucket& b) { return batched_powerSGD_hook(*state, b); };
  }
  return [state](GradBucket& b) { return powerSGD_hook(*state, b); };
}

CommHook hook_named(const std::string& name) {
  if (name.find("powerSGD") != std::string::npos) return powersgd_named(name);
  if (name == "allreduce") return allreduce_hook;
  if (name == "fp16_compress") return fp16_compress_hook;
  if (name == "bf16_compress") return bf16_compress_hook;
  if (name == "fp16_compress_wrapper(allreduce)") return fp16_compress_wrapper(allreduce_hook);
  throw std::invalid_argument("no hook " + name);
}

bool python_torch_available() { return oracle_configured(); }

json flat(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

template <typename Net>
json state_json(const Net& m) {
  json j;
  for (const auto& [name, t] : state_of(m)) j[name] = flat(t);
  return j;
}

template <typename Net>
NamedState state_from_json(const Net& like, const json& j) {
  NamedState out;
  for (const auto& [name, t] : state_of(like)) {
    std::vector<double> v = j.at(name).template get<std::vector<double>>();
    out.emplace_back(name, torch::tensor(v, at::kDouble).view(t.sizes()).to(t.scalar_type()));
  }
  return out;
}

// Trains `init` on kWorld thread ranks with ddp; returns rank 0's state.
template <typename Net>
Net make_net(const Scenario& sc) {
  if constexpr (std::is_same_v<Net, Twice>) {
    return Twice(sc.model == "twice_checkpointed");
  } else {
    return Net();
  }
}

template <typename Net>
NamedState train_with_ddp(const Net& init, const Scenario& sc, const at::Tensor& x,
                          const at::Tensor& y) {
  std::vector<Net> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(make_net<Net>(sc));
  for (auto& m : models) copy_state(init, m);
  NamedState rank0;
  run_ranks(kWorld, [&](int r) {
    DistributedDataParallelOptions o;
    o.find_unused_parameters = sc.find_unused;
    o.gradient_as_bucket_view = sc.bucket_view;
    o.static_graph = sc.static_graph;
    DistributedDataParallel<Net> model(models[r], o);
    if (!sc.comm_hook.empty()) model.register_comm_hook(hook_named(sc.comm_hook), sc.comm_hook);
    torch::optim::SGD opt(model.parameters(), 0.1);
    auto forward = [&](const at::Tensor& xs, int micro = -1) {
      if constexpr (std::is_same_v<Net, Branchy>) {
        return model(xs, r == sc.aux_rank && (sc.aux_micro == -1 || sc.aux_micro == micro));
      } else {
        return model(xs);
      }
    };
    if (!sc.rank_steps.empty()) {
      JoinOptions jo;
      jo.divide_by_initial_world_size = sc.divide_by_initial;
      join(model, [&] {
        for (int s = 0; s < sc.rank_steps[r]; ++s) {
          opt.zero_grad();
          torch::mse_loss(forward(x[s].narrow(0, r * kBatch, kBatch)),
                          y[s].narrow(0, r * kBatch, kBatch)).backward();
          opt.step();
        }
      }, jo);
      if (r == 0) rank0 = state_of(models[r]);
      return;
    }
    for (int s = 0; s < kSteps; s += sc.accumulate) {
      opt.zero_grad();
      for (int k = 0; k < sc.accumulate; ++k) {
        auto xs = x[s + k].narrow(0, r * kBatch, kBatch);
        auto ys = y[s + k].narrow(0, r * kBatch, kBatch);
        auto loss = torch::mse_loss(forward(xs, k), ys) / sc.accumulate;
        if (k + 1 < sc.accumulate) {
          auto guard = model.no_sync();
          loss.backward();
        } else {
          loss.backward();
        }
      }
      opt.step();
    }
    if (r == 0) rank0 = state_of(models[r]);
  });
  return rank0;
}

template <typename Net>
void add_case(const Scenario& sc, json& spec, std::vector<std::function<void(const json&)>>& checks) {
  torch::manual_seed(11 + static_cast<int>(checks.size()));
  auto init = std::make_shared<Net>(make_net<Net>(sc));
  at::Tensor x = torch::randn({kSteps, kWorld * kBatch, sc.in});
  at::Tensor y = torch::randn({kSteps, kWorld * kBatch, 4});
  spec["scenarios"].push_back({{"model", sc.model},
                               {"init", state_json(*init)},
                               {"x", flat(x)}, {"x_shape", x.sizes().vec()},
                               {"y", flat(y)}, {"y_shape", y.sizes().vec()},
                               {"lr", 0.1}, {"batch", kBatch},
                               {"accumulate", sc.accumulate}, {"aux_rank", sc.aux_rank},
                               {"find_unused_parameters", sc.find_unused},
                               {"aux_micro", sc.aux_micro},
                               {"gradient_as_bucket_view", sc.bucket_view},
                               {"comm_hook", sc.comm_hook},
                               {"static_graph", sc.static_graph}});
  if (!sc.rank_steps.empty()) {
    spec["scenarios"].back()["rank_steps"] = sc.rank_steps;
    spec["scenarios"].back()["divide_by_initial_world_size"] = sc.divide_by_initial;
  }
  checks.push_back([init, sc, x, y](const json& result) {
    NamedState ours = train_with_ddp(*init, sc, x, y);
    expect_same_state(ours, state_from_json(*init, result),
                      "scenario " + sc.model + (sc.comm_hook.empty() ? "" : " " + sc.comm_hook) +
                          (sc.static_graph ? " static_graph" : ""),
                      sc.atol());
  });
}

TEST(DdpOracle, MatchesPythonDistributedDataParallel) {
  if (!python_torch_available()) {
    GTEST_SKIP() << kNoOracle;
  }
  json spec;
  spec["world"] = kWorld;
  std::vector<std::function<void(const json&)>> checks;
  add_case<Mlp>({.model = "mlp"}, spec, checks);
  add_case<BnCnn>({.model = "bncnn", .in = 36}, spec, checks);
  add_case<Mlp>({.model = "mlp", .bucket_view = true}, spec, checks);
  add_case<Mlp>({.model = "mlp", .accumulate = 2}, spec, checks);  // no_sync, 2 micro-batches
  // aux used on rank 1
  add_case<Branchy>({.model = "branchy", .find_unused = true, .aux_rank = 1}, spec, checks);
  // join: dividing by the initial world size, then by the ranks still active
  add_case<Mlp>({.model = "mlp", .rank_steps = {2, 4}, .divide_by_initial = true}, spec, checks);
  add_case<Mlp>({.model = "mlp", .rank_steps = {3, 1}, .divide_by_initial = false}, spec, checks);
#if TORCH_VERSION_MAJOR >= 2
  // aux used by rank 1 in the first of 2 micro-steps only (inside no_sync):
  // its accumulated gradient must be averaged, not kept per rank. PyTorch
  // 1.13 keeps each rank's own gradient there (the silent divergence ddp
  // avoids); DdpNoSync.ParameterUsedOnlyInMicroStepsIsAveragedOnEveryRank
  // checks ddp against one process on both libtorch versions.
  add_case<Branchy>(
      {.model = "branchy", .find_unused = true, .accumulate = 2, .aux_rank = 1, .aux_micro = 0},
      spec, checks);
#endif
  // Built-in comm hooks, as torch.distributed.algorithms.ddp_comm_hooks.
  for (std::string hook : {"allreduce", "fp16_compress", "fp16_compress_wrapper(allreduce)"}) {
    add_case<Mlp>({.model = "mlp", .comm_hook = hook}, spec, checks);
  }
  for (std::string hook : {"allreduce", "fp16_compress"}) {  // no_sync + find_unused
    add_case<Branchy>({.model = "branchy", .find_unused = true, .accumulate = 2, .aux_rank = 1,
                       .comm_hook = hook},
                      spec, checks);
  }
#if TORCH_VERSION_MAJOR >= 2
  // PowerSGD from iteration 2 of 4, error feedback and warm start on.
  // (PyTorch 1.13's hooks differ: no batch_tensors_with_same_shape, 2-D
  // orthogonalisation; ddp follows 2.x.)
  for (std::string hook : {"powerSGD rank=1", "powerSGD rank=2", "batched_powerSGD rank=1"}) {
    add_case<Mlp>({.model = "mlp", .comm_hook = hook}, spec, checks);
  }
  // "w" and "mid.weight": two 8x8 matrices, stacked.
  add_case<Tied>({.model = "tied", .comm_hook = "powerSGD rank=1 same_shape"}, spec, checks);
  // PyTorch 1.13's Gloo cannot reduce bfloat16.
  add_case<Mlp>({.model = "mlp", .comm_hook = "bf16_compress"}, spec, checks);
#endif
  // static_graph: a module called twice (plain, and checkpointed with a
  // re-entrant backward: its gradient accumulates twice), and a parameter
  // used on one rank only, without find_unused_parameters.
  for (std::string model : {"twice", "twice_checkpointed"}) {
    add_case<Twice>({.model = model, .static_graph = true}, spec, checks);
  }
  add_case<Branchy>({.model = "branchy", .aux_rank = 1, .static_graph = true}, spec, checks);
  // A tied weight through the optimizer: stepped once per step, as Python.
  add_case<Tied>({.model = "tied"}, spec, checks);

  const TempDir dir("ddp-oracle");
  std::ofstream(dir.file("in.json")) << spec.dump();
  std::string cmd = "timeout 300 " + oracle_python() + " " DDP_SOURCE_DIR "/tests/oracle/ddp_oracle.py " +
                    dir.file("in.json") + " " + dir.file("out.json") + " > " + dir.file("log.txt") +
                    " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dir.file("log.txt"));
  std::string log_text((std::istreambuf_iterator<char>(log)), {});
  ASSERT_EQ(rc, 0) << "the Python oracle failed:\n" << log_text;
  json results = json::parse(std::ifstream(dir.file("out.json")));
  ASSERT_EQ(results.size(), checks.size());
  for (size_t i = 0; i < checks.size(); ++i) checks[i](results[i]);
}

}  // namespace
}  // namespace ddp::testing
