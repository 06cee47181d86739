// DDP's mixed precision (DistributedDataParallelOptions::mixed_precision)
// against PyTorch's _MixedPrecision algorithm computed in Python with
// PyTorch's kernels (tests/oracle/ddp_mixed_precision_oracle.py: PyTorch's
// own DDP mixed precision does not run on CPU): parameters and batch norm
// statistics step for step at world size 2, with a no_sync micro-step; the
// dtypes around forward and backward; the hooks surviving the dtype swap
// (unused parameters named, find_unused_parameters); bad options named.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::message_of;
using testing::run_ranks;
using testing::run_ranks_collect;

// The oracle's values(): formulas of the index, no generator.
at::Tensor values(int64_t n, double scale, int64_t shift) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(((i * 7 + shift) % 11 - 5) * scale);
  return torch::tensor(v);
}

// The oracle's model: linear 6->4, batch norm, relu, linear 4->3.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    w1 = register_parameter("w1", values(24, 0.1, 1).view({4, 6}));
    b1 = register_parameter("b1", values(4, 0.05, 2));
    w2 = register_parameter("w2", values(12, 0.1, 3).view({3, 4}));
    b2 = register_parameter("b2", values(3, 0.05, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    torch::NoGradGuard no_grad;
    bn->weight.copy_(values(4, 0.1, 6) + 1.0);
    bn->bias.copy_(values(4, 0.05, 7));
  }
  at::Tensor forward(const at::Tensor& x) {
    namespace F = torch::nn::functional;
    return F::linear(torch::relu(bn(F::linear(x, w1, b1))), w2, b2);
  }
  // In the oracle's order.
  std::vector<at::Tensor> ordered() const { return {w1, b1, bn->weight, bn->bias, w2, b2}; }
  at::Tensor w1, b1, w2, b2;
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int micro) {
  at::Tensor x = values(24, 0.5, 5 + step * 3 + rank * 13 + micro * 29).view({4, 6});
  at::Tensor y = (torch::arange(4, torch::kLong) + (step + rank + micro)) % 3;
  return {x, y};
}

std::vector<float> flat(const std::vector<at::Tensor>& ts) {
  std::vector<float> out;
  for (const at::Tensor& t : ts) {
    at::Tensor c = t.detach().to(at::kFloat).contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

nlohmann::json run_oracle() {
  testing::TempDir dir;
  const std::string out = dir.file("out.json");
  const std::string cmd = "timeout 120 " + testing::oracle_python() + " " DDP_SOURCE_DIR
                          "/tests/oracle/ddp_mixed_precision_oracle.py " + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

struct Record {
  std::vector<float> params, buffers;
};

// The oracle's loop on this rank; rank 0's state after each step.
std::vector<Record> train(int rank, const MixedPrecision& mp) {
  Net net;
  DistributedDataParallelOptions o;
  o.mixed_precision = mp;
  DistributedDataParallel<Net> model(net, o);
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<Record> records;
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    const int micro_steps = step == 3 ? 2 : 1;
    for (int micro = 0; micro < micro_steps; ++micro) {
      auto [x, y] = batch(step, rank, micro);
      auto loss_of = [&, x = x, y = y] {
        return torch::nn::functional::cross_entropy(model(x).to(at::kFloat), y) * 10.0;
      };
      if (micro + 1 < micro_steps) {
        auto guard = model.no_sync();
        loss_of().backward();
      } else {
        loss_of().backward();
      }
      for (const at::Tensor& p : net->ordered()) {
        EXPECT_EQ(p.scalar_type(), at::kFloat) << "after backward, step " << step;
        EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << "after backward, step " << step;
      }
    }
    opt.step();
    records.push_back({flat(net->ordered()), flat({net->bn->running_mean, net->bn->running_var})});
    EXPECT_EQ(net->bn->num_batches_tracked.scalar_type(), at::kLong);
  }
  return records;
}

TEST(DdpMixedPrecision, ParametersAndBuffersEqualPythonStepForStepAtWorldSize2) {
  if (!testing::oracle_configured()) GTEST_SKIP() << testing::kNoOracle;
  const nlohmann::json py = run_oracle();
  struct Config {
    const char* name;
    MixedPrecision mp;
  };
  const Config configs[] = {
      {"bf16_params_fp32_reduce", {at::kBFloat16, at::kFloat, at::kBFloat16}},
      {"bf16", {at::kBFloat16, std::nullopt, at::kBFloat16}},
      {"bf16_reduce_only", {std::nullopt, at::kBFloat16, std::nullopt}},
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(c.name);
    std::vector<Record> rank0;
    run_ranks(2, [&](int rank) {
      std::vector<Record> r = train(rank, c.mp);
      if (rank == 0) rank0 = r;
    });
    const nlohmann::json& steps = py.at(c.name);
    ASSERT_EQ(rank0.size(), steps.size());
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto params = steps[s].at("params").get<std::vector<float>>();
      const auto buffers = steps[s].at("buffers").get<std::vector<float>>();
      ASSERT_EQ(rank0[s].params.size(), params.size());
      EXPECT_EQ(rank0[s].params, params)
          << "step " << s << ": max |C++ - Python| " << max_diff(rank0[s].params, params);
      EXPECT_EQ(rank0[s].buffers, buffers)
          << "step " << s << ": max |C++ - Python| " << max_diff(rank0[s].buffers, buffers);
    }
  }
}

TEST(DdpMixedPrecision, LowPrecisionOnlyFromForwardToTheEndOfBackward) {
  run_ranks(1, [](int) {
    Net net;
    DistributedDataParallelOptions o;
    o.mixed_precision = MixedPrecision{at::kBFloat16, at::kFloat, at::kBFloat16};
    DistributedDataParallel<Net> model(net, o);
    EXPECT_EQ(net->w1.scalar_type(), at::kFloat);
    EXPECT_EQ(net->bn->running_mean.scalar_type(), at::kBFloat16);
    EXPECT_EQ(net->bn->num_batches_tracked.scalar_type(), at::kLong);  // PyTorch: bf16
    auto [x, y] = batch(0, 0, 0);
    at::Tensor out = model(x);
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    EXPECT_EQ(net->w1.scalar_type(), at::kBFloat16);
    EXPECT_EQ(net->bn->weight.scalar_type(), at::kBFloat16);
    torch::nn::functional::cross_entropy(out.to(at::kFloat), y).backward();
    for (const at::Tensor& p : net->ordered()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
    }
    {
      torch::NoGradGuard no_grad;  // evaluation: swapped back before it returns
      model.eval();
      EXPECT_EQ(model(x).scalar_type(), at::kBFloat16);
      EXPECT_EQ(net->w1.scalar_type(), at::kFloat);
    }
  });
}

// A model with a branch the loss may skip: the reducer's hooks must follow
// each cast (a dtype change gives the parameter a new gradient accumulator).
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 2));
    skipped = register_module("skipped", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(const at::Tensor& x, bool use_skipped) {
    at::Tensor h = torch::relu(a(x));
    return use_skipped ? b(h) + skipped(h) : b(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, skipped{nullptr};
};
TORCH_MODULE(Branchy);

TEST(DdpMixedPrecision, UnusedParametersAreNamedAndFoundAfterTheCast) {
  auto errors = run_ranks_collect(2, [](int rank) {
    torch::manual_seed(1);
    Branchy net;
    DistributedDataParallelOptions o;
    o.mixed_precision = MixedPrecision{at::kBFloat16, std::nullopt, std::nullopt};
    DistributedDataParallel<Branchy> model(net, o);
    model(torch::ones({2, 4}) * (rank + 1), true).to(at::kFloat).sum().backward();
    EXPECT_EQ(net->skipped->weight.grad().scalar_type(), at::kFloat);
    model(torch::ones({2, 4}), false).to(at::kFloat).sum().backward();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(message_of(errors[rank]).find("skipped.weight"), std::string::npos)
        << message_of(errors[rank]);
  }
  run_ranks(2, [](int rank) {
    torch::manual_seed(1);
    Branchy net;
    DistributedDataParallelOptions o;
    o.find_unused_parameters = true;
    o.mixed_precision = MixedPrecision{at::kBFloat16, at::kFloat, std::nullopt};
    DistributedDataParallel<Branchy> model(net, o);
    for (int step = 0; step < 3; ++step) {
      model.zero_grad();
      model(torch::ones({2, 4}) * (rank + 1), step == 1).to(at::kFloat).sum().backward();
      EXPECT_EQ(net->a->weight.grad().scalar_type(), at::kFloat);
      EXPECT_EQ(net->skipped->weight.grad().defined(), step == 1) << "step " << step;
      EXPECT_EQ(model.stats().unused_parameters_last, step == 1 ? 0 : 2);
    }
  });
}

TEST(DdpMixedPrecision, BadOptionsAreNamed) {
  run_ranks(1, [](int) {
    auto message = [](const DistributedDataParallelOptions& o) {
      try {
        Net net;
        DistributedDataParallel<Net> model(net, o);
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    DistributedDataParallelOptions o;
    o.mixed_precision = MixedPrecision{std::nullopt, at::kLong, std::nullopt};
    EXPECT_NE(message(o).find("mixed_precision.reduce_dtype is Long"), std::string::npos)
        << message(o);
    o.mixed_precision = MixedPrecision{at::kBFloat16, std::nullopt, std::nullopt};
    o.gradient_as_bucket_view = true;
    EXPECT_NE(message(o).find("gradient_as_bucket_view cannot be combined"), std::string::npos)
        << message(o);
  });
}

}  // namespace
}  // namespace ddp
