// SyncBatchNorm on W ranks (threads) equals plain BatchNorm in one process
// on the concatenation of the ranks' batches: outputs, input gradients,
// parameter gradients (summed over ranks) and running statistics; for 1d,
// 2d and 3d inputs, affine or not, tracked or not, momentum or cumulative
// average, equal and unequal batch sizes (0 included). Then eval mode,
// errors, convert_sync_batchnorm, and DDP training with a converted model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/sync_batchnorm.h"
#include "support/model_state.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

constexpr int64_t kChannels = 3;
constexpr double kTol = 1e-5;

// Values with a mean far from 0 (2) so that a variance formed carelessly
// from sums of squares would show.
at::Tensor sample(uint64_t seed, at::IntArrayRef shape) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen) * 1.5 + 2;
}

std::vector<int64_t> shape_of(int64_t n, const std::vector<int64_t>& spatial) {
  std::vector<int64_t> s{n, kChannels};
  s.insert(s.end(), spatial.begin(), spatial.end());
  return s;
}

// A plain BatchNorm of the dimension the input needs, and its tensors.
struct Plain {
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::Module> module;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

template <typename BN>
Plain plain_of(const torch::nn::BatchNormOptions& o) {
  BN bn(o);
  return {torch::nn::AnyModule(bn), bn.ptr(), bn->weight, bn->bias, bn->running_mean,
          bn->running_var, bn->num_batches_tracked};
}

Plain make_plain(size_t spatial_dims, const torch::nn::BatchNormOptions& o) {
  if (spatial_dims <= 1) return plain_of<torch::nn::BatchNorm1d>(o);
  if (spatial_dims == 2) return plain_of<torch::nn::BatchNorm2d>(o);
  return plain_of<torch::nn::BatchNorm3d>(o);
}

struct Case {
  std::vector<int64_t> spatial;  // {} is N x C
  std::vector<int64_t> batches;  // per rank; its size is the world size
  bool affine = true;
  bool track = true;
  bool cumulative = false;  // momentum unset
  at::ScalarType dtype = at::kFloat;
  bool channels_last = false;  // 4-d inputs in NHWC memory order
  bool input_grad = true;      // whether the input requires grad
};

std::string name_of(const Case& k) {
  std::string s = "spatial dims " + std::to_string(k.spatial.size()) + ", batches";
  for (int64_t b : k.batches) s += " " + std::to_string(b);
  return s + (k.affine ? ", affine" : "") + (k.track ? ", tracked" : "") +
         (k.cumulative ? ", cumulative" : "") + ", " + c10::toString(k.dtype) +
         (k.channels_last ? ", channels_last" : "") + (k.input_grad ? "" : ", no input grad");
}

// What one step produces: per rank output and input gradient, and the
// weight/bias gradients summed over ranks.
struct Step {
  std::vector<at::Tensor> out, grad_input;
  at::Tensor grad_weight, grad_bias;
};

struct Result {
  std::vector<Step> steps;
  NamedState buffers;  // running statistics after the steps
};

torch::nn::BatchNormOptions options_of(const Case& k) {
  torch::nn::BatchNormOptions o(kChannels);
  o.affine(k.affine).track_running_stats(k.track).momentum(0.3);
  if (k.cumulative) o.momentum(c10::nullopt);
  return o;
}

void init_affine(const at::Tensor& weight, const at::Tensor& bias) {
  if (!weight.defined()) return;
  torch::NoGradGuard g;
  weight.copy_(sample(7, {kChannels}) * 0.2);
  bias.copy_(sample(8, {kChannels}) * 0.3);
}

at::Tensor laid_out(const Case& k, at::Tensor t) {
  t = t.to(k.dtype);
  return k.channels_last ? t.contiguous(at::MemoryFormat::ChannelsLast) : t;
}
at::Tensor x_of(const Case& k, int step, int rank) {
  return laid_out(k, sample(100 * step + rank, shape_of(k.batches[rank], k.spatial)));
}
at::Tensor r_of(const Case& k, int step, int rank) {
  return laid_out(k, sample(5000 + 100 * step + rank, shape_of(k.batches[rank], k.spatial)) - 2);
}

// Loss sum(out * R): its gradient is R, the same per sample in both runs.
Result one_process(const Case& k, int steps) {
  Plain bn = make_plain(k.spatial.size(), options_of(k));
  bn.module->to(k.dtype);
  init_affine(bn.weight, bn.bias);
  Result res;
  const int world = static_cast<int>(k.batches.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<at::Tensor> xs, rs;
    for (int r = 0; r < world; ++r) {
      xs.push_back(x_of(k, s, r));
      rs.push_back(r_of(k, s, r));
    }
    at::Tensor x = laid_out(k, torch::cat(xs)).requires_grad_(k.input_grad);
    at::Tensor out = bn.any.forward(x);
    (out * torch::cat(rs)).sum().backward();
    Step st;
    st.out = out.detach().split_with_sizes(k.batches);
    if (k.input_grad) st.grad_input = x.grad().split_with_sizes(k.batches);
    if (k.affine) {
      st.grad_weight = bn.weight.grad().clone();
      st.grad_bias = bn.bias.grad().clone();
      bn.weight.mutable_grad().zero_();
      bn.bias.mutable_grad().zero_();
    }
    res.steps.push_back(st);
  }
  for (const auto& b : bn.module->named_buffers()) res.buffers.emplace_back(b.key(), b.value().clone());
  return res;
}

Result on_ranks(const Case& k, int steps) {
  const int world = static_cast<int>(k.batches.size());
  Result res;
  res.steps.resize(steps);
  for (Step& st : res.steps) st.out.resize(world), st.grad_input.resize(world);
  std::vector<std::vector<at::Tensor>> gw(steps), gb(steps);
  std::mutex mu;
  run_ranks(world, [&](int r) {
    SyncBatchNorm bn(options_of(k));
    bn->to(k.dtype);
    init_affine(bn->weight, bn->bias);
    for (int s = 0; s < steps; ++s) {
      at::Tensor x = x_of(k, s, r).requires_grad_(k.input_grad);
      at::Tensor out = bn(x);
      (out * r_of(k, s, r)).sum().backward();
      std::lock_guard<std::mutex> lock(mu);
      res.steps[s].out[r] = out.detach();
      if (k.input_grad) res.steps[s].grad_input[r] = x.grad();
      if (k.affine) {
        gw[s].push_back(bn->weight.grad().clone());
        gb[s].push_back(bn->bias.grad().clone());
        bn->weight.mutable_grad().zero_();
        bn->bias.mutable_grad().zero_();
      }
    }
    if (r == 0) {
      for (const auto& b : bn->named_buffers()) res.buffers.emplace_back(b.key(), b.value().clone());
    }
  });
  for (int s = 0; s < steps && k.affine; ++s) {
    res.steps[s].grad_weight = torch::stack(gw[s]).sum(0);
    res.steps[s].grad_bias = torch::stack(gb[s]).sum(0);
  }
  return res;
}

double diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 && b.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

void expect_equal_runs(const Case& k) {
  SCOPED_TRACE(name_of(k));
  const int steps = 3;
  Result want = one_process(k, steps);
  Result got = on_ranks(k, steps);
  for (int s = 0; s < steps; ++s) {
    for (size_t r = 0; r < k.batches.size(); ++r) {
      ASSERT_EQ(got.steps[s].out[r].sizes(), want.steps[s].out[r].sizes());
      EXPECT_LE(diff(got.steps[s].out[r], want.steps[s].out[r]), kTol) << "output, step " << s << " rank " << r;
      if (k.input_grad) {
        EXPECT_LE(diff(got.steps[s].grad_input[r], want.steps[s].grad_input[r]), kTol)
            << "input gradient, step " << s << " rank " << r;
      }
    }
    if (k.affine) {
      EXPECT_LE(diff(got.steps[s].grad_weight, want.steps[s].grad_weight), kTol) << "weight grad, step " << s;
      EXPECT_LE(diff(got.steps[s].grad_bias, want.steps[s].grad_bias), kTol) << "bias grad, step " << s;
    }
  }
  expect_same_state(got.buffers, want.buffers, "running statistics", kTol);
}

TEST(SyncBatchNorm, EqualsBatchNormOnTheConcatenatedBatch) {
  for (std::vector<int64_t> spatial : {std::vector<int64_t>{}, {5}, {3, 4}, {2, 2, 3}}) {
    for (std::vector<int64_t> batches : {std::vector<int64_t>{6}, {3, 3}, {2, 2, 2}, {2, 2, 2, 2}}) {
      expect_equal_runs({spatial, batches});
    }
  }
}

TEST(SyncBatchNorm, EqualsBatchNormWithoutAffineOrTrackingOrMomentum) {
  for (std::vector<int64_t> spatial : {std::vector<int64_t>{}, {3, 4}}) {
    expect_equal_runs({spatial, {3, 2}, /*affine=*/false, /*track=*/true});
    expect_equal_runs({spatial, {3, 2}, /*affine=*/true, /*track=*/false});
    expect_equal_runs({spatial, {3, 2}, /*affine=*/true, /*track=*/true, /*cumulative=*/true});
    expect_equal_runs({spatial, {2, 2, 2}, /*affine=*/false, /*track=*/false});
  }
}

TEST(SyncBatchNorm, UnequalBatchSizesIncludingAnEmptyRank) {
  for (std::vector<int64_t> spatial : {std::vector<int64_t>{}, {5}, {3, 4}, {2, 2, 3}}) {
    for (std::vector<int64_t> batches : {std::vector<int64_t>{0, 1, 2, 3}, {5, 0}, {1, 4}, {2, 0, 3}}) {
      expect_equal_runs({spatial, batches});
    }
  }
}

TEST(SyncBatchNorm, Float64ChannelsLastAndAnInputWithoutGrad) {
  Case k{{3, 4}, {3, 2}};
  k.dtype = at::kDouble;
  expect_equal_runs(k);
  k.dtype = at::kFloat;
  k.channels_last = true;
  expect_equal_runs(k);
  k.channels_last = false;
  k.input_grad = false;  // no backward all_reduce; parameter gradients still right
  expect_equal_runs(k);
}

// bfloat16 data far from 0 (mean 100, std 1): normalized in float32 and
// rounded once, so the error is bfloat16's rounding of the result (|y| <~ 4:
// at most 2^-6), not a cancellation of -mean/std against x in 16 bits.
TEST(SyncBatchNorm, BFloat16FarFromZeroIsNormalizedInFloat) {
  std::vector<at::Tensor> xs = {sample(1, {4, kChannels, 5}) / 1.5 + 98.7,
                                sample(2, {4, kChannels, 5}) / 1.5 + 98.7};
  for (auto& x : xs) x = x.to(at::kBFloat16);
  torch::nn::BatchNorm1d plain(kChannels);
  at::Tensor want = plain(torch::cat(xs).to(at::kFloat));
  run_ranks(2, [&](int r) {
    SyncBatchNorm bn(kChannels);
    at::Tensor got = bn(xs[r]);
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    EXPECT_LE(diff(got, want.narrow(0, 4 * r, 4)), 1.0 / 64) << "rank " << r;
  });
}

TEST(SyncBatchNorm, EvalUsesTheRunningStatisticsWithoutCommunicating) {
  Case k{{3, 4}, {3, 3}};
  Plain bn = make_plain(2, options_of(k));
  init_affine(bn.weight, bn.bias);
  {
    torch::NoGradGuard g;
    bn.running_mean.copy_(sample(11, {kChannels}));
    bn.running_var.copy_(sample(12, {kChannels}).abs() + 0.5);
  }
  bn.module->eval();
  // One rank only evaluates: a collective would make it wait for the other.
  run_ranks(2, [&](int r) {
    SyncBatchNorm sync(options_of(k));
    sync->share_state(bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked);
    sync->eval();
    if (r != 0) return;
    at::Tensor x = x_of(k, 0, r);
    EXPECT_LE(diff(sync(x), bn.any.forward(x)), 1e-6);
  });
}

TEST(SyncBatchNorm, WrongInputsAreNamed) {
  SyncBatchNorm bn(4);
  try {
    bn(torch::zeros({8}));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SyncBatchNorm(4): expected an N x 4 x * input"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bn(torch::zeros({2, 3, 5})), InvalidArgument);
  EXPECT_THROW(bn(torch::zeros({2, 4}, at::kLong)), InvalidArgument);
}

TEST(SyncBatchNorm, OneValuePerChannelOverTheGroupFailsOnEveryRank) {
  auto errors = run_ranks_collect(2, [&](int r) {
    SyncBatchNorm bn(kChannels);
    bn(torch::ones({r == 0 ? 1 : 0, kChannels}));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(is_a<InvalidArgument>(errors[r])) << message_of(errors[r]);
    EXPECT_NE(message_of(errors[r]).find("expected more than 1 value per channel when training, got 1 "
                                         "over the group of 2 ranks"),
              std::string::npos)
        << message_of(errors[r]);
  }
}


// features: conv -> bn -> relu -> flatten; head: linear -> bn -> linear.
// 1 x 6 x 6 inputs, 3 outputs. The BatchNorms are Sequential elements
// under a module of our own (convert_sync_batchnorm recurses through it).
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl() {
    namespace nn = torch::nn;
    features = register_module("features", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3)),
                                                          nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten()));
    head = register_module("head", nn::Sequential(nn::Linear(64, 5), nn::BatchNorm1d(5), nn::Linear(5, 3)));
  }
  at::Tensor forward(const at::Tensor& x) { return head->forward(features->forward(x)); }
  torch::nn::Sequential features{nullptr}, head{nullptr};
};
TORCH_MODULE(SmallCnn);

struct HoldsABatchNorm : torch::nn::Module {
  HoldsABatchNorm() {
    body = register_module("body", torch::nn::Sequential(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3)));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

TEST(ConvertSyncBatchnorm, ReplacesSequentialElementsKeepingTheirTensors) {
  torch::manual_seed(3);
  SmallCnn net;
  // The old layer (the Sequential lets go of it).
  auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(net->features->ptr(1));
  at::Tensor weight = bn->weight, running_mean = bn->running_mean;
  net->eval();
  EXPECT_EQ(convert_sync_batchnorm(*net), 2);
  EXPECT_EQ(net->features[1]->as<torch::nn::BatchNorm2d>(), nullptr);
  auto* sync = net->features[1]->as<SyncBatchNorm>();
  ASSERT_NE(sync, nullptr);
  EXPECT_FALSE(sync->is_training());  // the replaced layer's mode
  EXPECT_TRUE(sync->weight.is_same(weight));
  EXPECT_TRUE(net->named_parameters()["features.1.weight"].is_same(weight));
  ASSERT_NE(net->head[1]->as<SyncBatchNorm>(), nullptr);
  // Buffers share storage: updates show in the old layer's tensors.
  net->train();
  net->forward(sample(1, {4, 1, 6, 6}));
  EXPECT_GT(running_mean.abs().sum().item<double>(), 0);
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(convert_sync_batchnorm(*net), 0);  // nothing left to convert
  std::ostringstream printed;
  printed << *net;
  EXPECT_NE(printed.str().find("ddp::SyncBatchNorm(4, eps=1e-05, momentum=0.1, affine=true"), std::string::npos)
      << printed.str();
}

TEST(ConvertSyncBatchnorm, RefusesALayerHeldByAFieldAndChangesNothing) {
  auto m = std::make_shared<HoldsABatchNorm>();
  try {
    convert_sync_batchnorm(*m);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'bn' is a torch::nn::BatchNorm1dImpl held by"), std::string::npos) << msg;
    EXPECT_NE(msg.find("declare it as ddp::SyncBatchNorm"), std::string::npos) << msg;
  }
  EXPECT_NE(m->body[1]->as<torch::nn::BatchNorm1d>(), nullptr);  // not converted either
  torch::nn::BatchNorm2d alone(3);
  EXPECT_THROW(convert_sync_batchnorm(*alone), InvalidArgument);
}

TEST(ConvertSyncBatchnorm, KeepsTheDtypeOfAMovedModelAndConvertsASharedLayerOnce) {
  SmallCnn net;
  net->to(at::kDouble);
  auto shared = std::make_shared<torch::nn::Module>();
  shared->register_module("a", net->head);
  shared->register_module("b", net->head);  // one Sequential under two names
  EXPECT_EQ(convert_sync_batchnorm(*shared), 1);
  auto* sync = net->head[1]->as<SyncBatchNorm>();
  ASSERT_NE(sync, nullptr);
  EXPECT_EQ(sync->running_mean.scalar_type(), at::kDouble);
  EXPECT_TRUE(net->head->named_children()["1"].get() == sync);
  net->train();
  net->forward(sample(2, {4, 1, 6, 6}).to(at::kDouble));
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_GT(sync->running_mean.abs().sum().item<double>(), 0);
}

// Trains small_cnn with SGD: DDP over W ranks with converted layers against
// one process on the concatenated batches with plain BatchNorm.
NamedState train_cnn(int world, bool convert, int steps) {
  torch::manual_seed(9);
  SmallCnn init;
  auto batch = [](int step, int r) { return sample(300 + 10 * step + r, {4, 1, 6, 6}); };
  auto target = [](int step, int r) { return sample(900 + 10 * step + r, {4, 3}); };
  if (world == 1) {
    torch::optim::SGD opt(init->parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(init->forward(torch::cat({batch(s, 0), batch(s, 1)})),
                      torch::cat({target(s, 0), target(s, 1)}))
          .backward();
      opt.step();
    }
    return state_of(init);
  }
  NamedState out;
  run_ranks(world, [&](int r) {
    SmallCnn net;
    copy_state(init, net);
    if (convert) convert_sync_batchnorm(*net);
    DistributedDataParallel<SmallCnn> model(net);
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(model(batch(s, r)), target(s, r)).backward();
      opt.step();
    }
    if (r == 0) out = state_of(net);
  });
  return out;
}

TEST(ConvertSyncBatchnorm, DdpTrainingEqualsOneProcessOnTheWholeBatch) {
  NamedState want = train_cnn(1, false, 4);
  NamedState got = train_cnn(2, true, 4);
  expect_same_state(got, want, "SyncBatchNorm under DDP", kTol);
  // Plain BatchNorm under DDP normalizes per rank: visibly different.
  EXPECT_GT(max_diff(train_cnn(2, false, 4), want), 1e-3);
}

}  // namespace
}  // namespace ddp::testing
