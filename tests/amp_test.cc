// Mixed precision (include/ddp/grad_scaler.h, include/ddp/autocast.h)
// against PyTorch's own on CPU (tests/oracle/amp_oracle.py): GradScaler's
// scale, skipped steps and parameters step for step, across a save and
// resume of its state, under DDP at world size 2, with an inf on one rank of
// a sharded optimizer; AutocastGuard's dtype per op, nesting, threads.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/autocast.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/grad_scaler.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::message_of;
using testing::run_ranks;
using testing::run_ranks_collect;

// amp_oracle.py's values(): formulas of the index, no generator.
at::Tensor values(int64_t n, double scale, int64_t shift) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(((i * 7 + shift) % 11 - 5) * scale);
  return torch::tensor(v);
}

// The oracle's MLP as a module (DistributedDataParallel wraps modules).
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    w1 = register_parameter("w1", values(24, 0.1, 1).view({4, 6}));
    b1 = register_parameter("b1", values(4, 0.05, 2));
    w2 = register_parameter("w2", values(12, 0.1, 3).view({3, 4}));
    b2 = register_parameter("b2", values(3, 0.05, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    return torch::nn::functional::linear(torch::relu(torch::nn::functional::linear(x, w1, b1)),
                                         w2, b2);
  }
  at::Tensor w1, b1, w2, b2;
};
TORCH_MODULE(Mlp);

at::Tensor inputs() { return values(48, 0.5, 5).view({8, 6}); }
at::Tensor labels() { return torch::arange(8, torch::kLong) % 3; }

struct Step {
  double scale;
  bool skipped;
  std::vector<float> params;
};

std::vector<float> flat(const std::vector<at::Tensor>& params) {
  std::vector<float> out;
  for (const at::Tensor& p : params) {
    at::Tensor c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

// The oracle's loop: steps [from, to) of 10 x cross-entropy, SGD with
// momentum, unscale_ and clip_grad_norm_ on even steps.
template <typename Model>
std::vector<Step> train(Model& model, const std::vector<at::Tensor>& params,
                        torch::optim::Optimizer& opt, GradScaler& scaler, int from, int to,
                        const at::Tensor& x, const at::Tensor& y) {
  std::vector<Step> steps;
  for (int step = from; step < to; ++step) {
    opt.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(model(x), y) * 10.0;
    scaler.scale(loss).backward();
    if (step % 2 == 0) {
      scaler.unscale_(opt);
      torch::nn::utils::clip_grad_norm_(params, 1.0);
    }
    const std::vector<float> before = flat(params);
    const bool stepped = scaler.step(opt);
    EXPECT_EQ(stepped, flat(params) != before) << "step " << step;
    scaler.update();
    steps.push_back({scaler.get_scale(), !stepped, flat(params)});
  }
  return steps;
}

GradScalerOptions oracle_options() {
  GradScalerOptions o;
  o.init_scale = std::pow(2.0, 127);
  o.growth_interval = 3;
  return o;
}

nlohmann::json run_oracle(const std::string& what) {
  testing::TempDir dir;
  const std::string out = dir.file("out.json");
  const std::string cmd = "timeout 120 " + testing::oracle_python() + " " DDP_SOURCE_DIR
                          "/tests/oracle/amp_oracle.py " + what + " " + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

// The message of the InvalidArgument that f throws ("no error" if none).
std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(GradScaler, ScaleSkippedStepsAndParametersEqualPythonStepForStep) {
  if (!testing::oracle_configured()) GTEST_SKIP() << testing::kNoOracle;
  const nlohmann::json py = run_oracle("scaler");
  Mlp net;
  std::vector<at::Tensor> params = net->parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler scaler(oracle_options());
  const std::vector<Step> steps = train(net, params, opt, scaler, 0, 12, inputs(), labels());
  ASSERT_EQ(py["steps"].size(), steps.size());
  int skipped = 0, grew = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    const auto& p = py["steps"][k];
    EXPECT_EQ(steps[k].scale, p["scale"].get<double>()) << "step " << k;
    EXPECT_EQ(steps[k].skipped, p["skipped"].get<bool>()) << "step " << k;
    // clip_grad_norm_'s norm sums in another order in Python (foreach).
    EXPECT_LE(max_diff(steps[k].params, p["params"].get<std::vector<float>>()), 1e-6)
        << "step " << k;
    skipped += steps[k].skipped;
    grew += k > 0 && steps[k].scale > steps[k - 1].scale;
  }
  EXPECT_GE(skipped, 3);  // the run has both
  EXPECT_GE(grew, 2);
  const GradScalerState s = scaler.state_dict();
  EXPECT_EQ(s.scale, py["state_dict"]["scale"].get<double>());
  EXPECT_EQ(s.growth_tracker, py["state_dict"]["_growth_tracker"].get<int64_t>());
  EXPECT_EQ(s.growth_interval, 3);
}

// A checkpoint's metadata keeps the scaler's state: stopping after step 6
// and resuming from it ends exactly as the run that never stopped.
TEST(GradScaler, ResumeFromItsStateEndsAsTheUninterruptedRun) {
  Mlp full_net;
  std::vector<at::Tensor> full_params = full_net->parameters();
  torch::optim::SGD full_opt(full_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler full_scaler(oracle_options());
  const auto full = train(full_net, full_params, full_opt, full_scaler, 0, 12, inputs(), labels());

  Mlp net;
  std::vector<at::Tensor> params = net->parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler first(oracle_options());
  train(net, params, opt, first, 0, 6, inputs(), labels());
  const std::string saved = first.state_dict().to_string();
  GradScaler second;  // other defaults: the state brings its own
  second.load_state_dict(GradScalerState::from_string(saved));
  EXPECT_EQ(second.get_scale(), first.get_scale());
  const auto rest = train(net, params, opt, second, 6, 12, inputs(), labels());
  for (size_t k = 0; k < rest.size(); ++k) {
    EXPECT_EQ(rest[k].scale, full[6 + k].scale) << k;
    EXPECT_EQ(rest[k].skipped, full[6 + k].skipped) << k;
    EXPECT_EQ(rest[k].params, full[6 + k].params) << k;
  }
  EXPECT_EQ(second.state_dict().to_string(), full_scaler.state_dict().to_string());
}

// Under DistributedDataParallel every rank sees the averaged gradients, so
// the ranks skip the same steps as one process on the whole batch.
TEST(GradScaler, TwoDdpRanksSkipAndScaleAsOneProcessOnTheWholeBatch) {
  Mlp one_net;
  std::vector<at::Tensor> one_params = one_net->parameters();
  torch::optim::SGD one_opt(one_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler one_scaler(oracle_options());
  const auto one = train(one_net, one_params, one_opt, one_scaler, 0, 12, inputs(), labels());
  std::vector<std::vector<Step>> ranks(2);
  run_ranks(2, [&](int rank) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    std::vector<at::Tensor> params = net->parameters();
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    GradScaler scaler(oracle_options());
    ranks[rank] = train(model, params, opt, scaler, 0, 12, inputs().narrow(0, 4 * rank, 4),
                        labels().narrow(0, 4 * rank, 4));
  });
  for (size_t k = 0; k < one.size(); ++k) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r][k].scale, one[k].scale) << "rank " << r << " step " << k;
      EXPECT_EQ(ranks[r][k].skipped, one[k].skipped) << "rank " << r << " step " << k;
      EXPECT_LE(max_diff(ranks[r][k].params, one[k].params), 1e-6) << "rank " << r << " step " << k;
    }
    EXPECT_EQ(ranks[0][k].params, ranks[1][k].params) << "step " << k;
  }
}

// Ranks with different gradients (a ZeroRedundancyOptimizer without DDP's
// averaging): an inf in rank 1's local gradient alone makes both ranks skip
// the step and back off, as PyTorch's ShardedGradScaler; with a plain
// optimizer (nothing to combine over) rank 0 steps alone.
TEST(GradScaler, AnInfOnOneRankOfAShardedOptimizerSkipsTheStepOnEveryRank) {
  auto run = [](bool sharded) {
    std::vector<bool> stepped(2);
    std::vector<double> scales(2);
    run_ranks(2, [&](int rank) {
      Mlp net;
      std::unique_ptr<torch::optim::Optimizer> opt;
      if (sharded) {
        opt = std::make_unique<ZeroRedundancyOptimizer>(net->parameters(),
                                                        torch::optim::SGDOptions(0.1));
      } else {
        opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
      }
      GradScaler scaler;
      scaler.scale(torch::nn::functional::cross_entropy(net(inputs()), labels())).backward();
      if (rank == 1) net->w2.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
      stepped[rank] = scaler.step(*opt);
      scaler.update();
      scales[rank] = scaler.get_scale();
    });
    return std::make_pair(stepped, scales);
  };
  auto [stepped, scales] = run(true);
  EXPECT_FALSE(stepped[0]);
  EXPECT_FALSE(stepped[1]);
  EXPECT_EQ(scales[0], 32768.0);
  EXPECT_EQ(scales[1], 32768.0);
  auto [plain, plain_scales] = run(false);
  EXPECT_TRUE(plain[0]);  // what combining prevents
  EXPECT_FALSE(plain[1]);
  EXPECT_NE(plain_scales[0], plain_scales[1]);
}

TEST(GradScaler, MisuseIsNamedAsPyTorchNamesIt) {
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  Mlp net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  EXPECT_TRUE(has(message([&] { scaler.step(opt); }), "scaler.scale(loss)"));
  scaler.scale(torch::nn::functional::cross_entropy(net(inputs()), labels())).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(has(message([&] { scaler.unscale_(opt); }),
                  "unscale_() has already been called on this optimizer since the last update()"));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(has(message([&] { scaler.step(opt); }),
                  "step() has already been called since the last update()"));
  EXPECT_TRUE(has(message([&] { scaler.unscale_(opt); }), "unscale_() is being called after step()"));
  scaler.update();
  EXPECT_TRUE(has(message([&] { scaler.update(); }), "no inf checks were recorded"));
  net->w1.mutable_grad() = at::ones_like(net->w1, at::kHalf);
  EXPECT_TRUE(has(message([&] { scaler.unscale_(opt); }), "FP16 gradients"));
  GradScalerOptions bad;
  bad.growth_factor = 1.0;
  EXPECT_TRUE(has(message([&] { GradScaler s(bad); }), "growth_factor must be > 1, got 1"));
  bad = {};
  bad.backoff_factor = 1.5;
  EXPECT_TRUE(has(message([&] { GradScaler s(bad); }), "backoff_factor must be in (0, 1), got 1.5"));
  EXPECT_TRUE(has(message([] { GradScalerState::from_string("scale=x"); }), "'scale=x'"));
  EXPECT_TRUE(has(message([] { GradScalerState::from_string("scale=1 scale=1 scale=1 scale=1 "
                                                            "scale=1"); }),
                  "('scale' twice)"));
  // A state no scaler reaches, as a damaged checkpoint could hold: refused,
  // not loaded into a scaler that would then skip every step.
  GradScaler fresh;
  for (const char* text : {"scale=inf growth_factor=2 backoff_factor=0.5 growth_interval=2000 "
                           "growth_tracker=0",
                           "scale=nan growth_factor=2 backoff_factor=0.5 growth_interval=2000 "
                           "growth_tracker=0",
                           "scale=8 growth_factor=inf backoff_factor=0.5 growth_interval=2000 "
                           "growth_tracker=0",
                           "scale=8 growth_factor=2 backoff_factor=0.5 growth_interval=2000 "
                           "growth_tracker=-1"}) {
    const GradScalerState s = GradScalerState::from_string(text);
    EXPECT_TRUE(has(message([&] { fresh.load_state_dict(s); }), "the source is damaged")) << text;
  }
  // Every state a scaler writes parses back to itself.
  const GradScalerState odd{.scale = 0.1 + 0.2, .growth_factor = 1.0000000000000002,
                            .backoff_factor = 1.0 / 3, .growth_interval = 7, .growth_tracker = 3};
  const GradScalerState back = GradScalerState::from_string(odd.to_string());
  EXPECT_EQ(back.scale, odd.scale);
  EXPECT_EQ(back.growth_factor, odd.growth_factor);
  EXPECT_EQ(back.backoff_factor, odd.backoff_factor);
  EXPECT_EQ(back.growth_interval, odd.growth_interval);
  EXPECT_EQ(back.growth_tracker, odd.growth_tracker);
}

TEST(GradScaler, ADisabledScalerPassesEverythingThrough) {
  Mlp net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  GradScalerOptions o;
  o.enabled = false;
  GradScaler scaler(o);
  at::Tensor loss = torch::nn::functional::cross_entropy(net(inputs()), labels());
  EXPECT_TRUE(scaler.scale(loss).equal(loss));
  loss.backward();
  const auto before = flat(net->parameters());
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_NE(flat(net->parameters()), before);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.state_dict().scale, 0.0);
}

// Each op's result dtype under autocast, as PyTorch's lists give it.
TEST(Autocast, EachOpGivesPythonsDtype) {
  if (!testing::oracle_configured()) GTEST_SKIP() << testing::kNoOracle;
  const nlohmann::json py = run_oracle("dtypes");
  namespace F = torch::nn::functional;
  const at::Tensor x = values(2 * 3 * 5 * 5, 0.25, 1).view({2, 3, 5, 5});
  const at::Tensor w = values(4 * 3 * 3 * 3, 0.1, 2).view({4, 3, 3, 3});
  const at::Tensor m = values(6 * 4, 0.1, 3).view({6, 4});
  const at::Tensor lw = values(5 * 4, 0.1, 4).view({5, 4});
  const at::Tensor y = torch::tensor({0, 1, 2, 3, 4, 0}, torch::kLong);
  for (const auto& [name, dtype] : {std::pair{"bf16", at::kBFloat16}, std::pair{"fp16", at::kHalf}}) {
    AutocastGuard autocast(c10::kCPU, dtype);
    const std::map<std::string, at::ScalarType> got = {
        {"linear", F::linear(m, lw).scalar_type()},
        {"conv2d", F::conv2d(x, w).scalar_type()},
        {"batch_norm", F::batch_norm(x, at::Tensor(), at::Tensor(),
                                     F::BatchNormFuncOptions().training(true)).scalar_type()},
        {"layer_norm", F::layer_norm(m, F::LayerNormFuncOptions({4})).scalar_type()},
        {"softmax", F::softmax(m, 1).scalar_type()},
        {"log_softmax", F::log_softmax(m, 1).scalar_type()},
        {"cross_entropy", F::cross_entropy(F::linear(m, lw), y).scalar_type()},
        {"relu", F::relu(F::linear(m, lw)).scalar_type()},
        {"max_pool2d", F::max_pool2d(F::conv2d(x, w), F::MaxPool2dFuncOptions(2)).scalar_type()},
        {"matmul", torch::matmul(m, lw.t()).scalar_type()},
        {"add", (F::linear(m, lw) + 1.0).scalar_type()},
        {"mse_loss", F::mse_loss(F::linear(m, lw), torch::zeros({6, 5})).scalar_type()},
    };
    for (const auto& [op, type] : got) {
      std::string text = c10::toString(type);
      const std::string expect = py[name][op].get<std::string>();
      const std::string as_python = text == "Float" ? "float32"
                                    : text == "BFloat16" ? "bfloat16"
                                    : text == "Half"     ? "float16"
                                                         : text;
      EXPECT_EQ(as_python, expect) << name << " " << op;
    }
  }
}

// Nesting restores the outer settings; a disabled inner scope runs in
// float32; the state is the constructing thread's only.
TEST(Autocast, NestedScopesRestoreAndOtherThreadsAreUntouched) {
  const at::Tensor a = torch::ones({2, 3}), b = torch::ones({3, 2});
  EXPECT_FALSE(is_autocast_enabled(c10::kCPU));
  {
    AutocastGuard outer(c10::kCPU, at::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(c10::kCPU, AutocastOptions{std::nullopt, /*enabled=*/false, std::nullopt});
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kFloat);
      EXPECT_FALSE(is_autocast_enabled(c10::kCPU));
    }
    {
      AutocastGuard other(c10::kCPU, at::kHalf);
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kHalf);
    }
    EXPECT_TRUE(is_autocast_enabled(c10::kCPU));
    EXPECT_EQ(get_autocast_dtype(c10::kCPU), at::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kBFloat16);
    at::ScalarType elsewhere = at::kBFloat16;
    std::thread([&] { elsewhere = torch::matmul(a, b).scalar_type(); }).join();
    EXPECT_EQ(elsewhere, at::kFloat);
  }
  EXPECT_FALSE(is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kFloat);
}

TEST(Autocast, BadDevicesAndDtypesAreNamed) {
  EXPECT_NE(message([] { AutocastGuard g(c10::kCPU, at::kDouble); })
                .find("dtype Double is not an autocast dtype; use at::kBFloat16 or at::kHalf"),
            std::string::npos);
  EXPECT_NE(message([] { AutocastGuard g(c10::kMeta, at::kHalf); }).find("is not supported"),
            std::string::npos);
  EXPECT_FALSE(is_autocast_enabled(c10::kCPU));  // nothing left set
  if (!torch::cuda::is_available()) {
    AutocastGuard g(c10::kCUDA, at::kHalf);  // warns, stays off (as Python)
    EXPECT_FALSE(is_autocast_enabled(c10::kCUDA));
  }
}

}  // namespace
}  // namespace ddp
