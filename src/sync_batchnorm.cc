// SyncBatchNorm: the group-wide batch statistics (Note [SyncBatchNorm
// statistics]) in a custom autograd function, and convert_sync_batchnorm.
#include "ddp/sync_batchnorm.h"

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "tensor_text.h"

namespace ddp {
namespace {

// Note [SyncBatchNorm statistics]
// Each rank contributes, per channel c, n (its element count per channel),
// n*mean_c and n*(var_c + mean_c^2), with mean and biased var from
// BatchNorm's own statistics kernel (Welford). Summed over the group in
// float64 these are N, the sum and the sum of squares of the whole batch,
// so var = S2/N - (S1/N)^2 is the concatenated batch's biased variance
// whatever each rank's n (0 included: it adds zeros). float64 keeps the
// cancellation in S2/N - mean^2 far below float32's resolution unless
// |mean| exceeds the standard deviation by about 10^4. PyTorch instead
// all_gathers (mean, invstd, count) and combines them; one all_reduce of
// additive terms gives the same statistics with one collective that our
// shared-memory path runs in place.
//
// Backward needs, for the input gradient of y = (x - mean) * invstd * w + b,
// the group's per-channel sums of dy and of dy * xhat, xhat = (x - mean) *
// invstd (BatchNorm's backward kernel computes both as its bias and weight
// gradients when given the group's mean and invstd):
//   dx = (dy - sum_dy/N - xhat * sum_dy_xhat/N) * invstd * w
// (mean and invstd depend on every rank's x). The weight and bias gradients
// use this rank's sums only; DistributedDataParallel averages them, exactly
// as it does for any other parameter.

// Views a C-element tensor so that it broadcasts over N x C x *.
at::Tensor per_channel(const at::Tensor& t, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = t.numel();
  return t.view(shape);
}

// The type the element-wise passes compute in: float for float16/bfloat16
// inputs (the per-channel shift is about -mean/std and would cancel
// against the input in 16 bits), else the input's own.
at::ScalarType compute_type(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// dx = k * (dy - sum_dy/N - xhat * sum_dy_xhat/N), k = invstd * weight,
// as A*dy + B*x + D per channel (two fused passes). `sums`: the group's
// sum_dy then sum_dy_xhat (float64); `total`: N.
at::Tensor input_gradient(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& saved_mean, const at::Tensor& saved_invstd,
                          double total, const at::Tensor& sums) {
  const int64_t c = input.size(1);
  at::Tensor mean = saved_mean.to(at::kDouble), invstd = saved_invstd.to(at::kDouble);
  at::Tensor k = weight.numel() > 0 ? invstd * weight.to(at::kDouble) : invstd;
  at::Tensor b = -k * invstd * (sums.narrow(0, c, c) / total);
  at::Tensor d = -k * (sums.narrow(0, 0, c) / total) - b * mean;
  const auto ct = compute_type(input.scalar_type());
  const int64_t dim = input.dim();
  at::Tensor partial =
      at::addcmul(per_channel(d.to(ct), dim), input.to(ct), per_channel(b.to(ct), dim));
  return at::addcmul(partial, dy.to(ct), per_channel(k.to(ct), dim)).to(input.scalar_type());
}

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(ProcessGroupPtr g) : group(std::move(g)) {}
  ProcessGroupPtr group;
};

struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  // Returns the normalized input; updates running_mean/var when given.
  // weight, bias and the running statistics are C-element tensors, or
  // 0-element placeholders when the layer has none.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias,
                            at::Tensor running_mean, at::Tensor running_var, double eps,
                            double momentum, const ProcessGroupPtr& group) {
    const int64_t c = input.size(1);
    const int64_t n = input.numel() / c;
    at::Tensor stats = at::zeros({2 * c + 1}, input.options().dtype(at::kDouble));
    const auto dt = input.scalar_type();
    const auto ct = compute_type(dt);
    const at::Tensor x = dt == ct ? input : input.to(ct);  // float for 16-bit inputs
    if (n > 0) {
      // This rank's mean and biased variance: BatchNorm's own (Welford)
      // kernel, one pass (its results have x's type: 16 bits would round
      // the mean).
      auto [local_mean, local_var] = at::batch_norm_update_stats(x, {}, {}, 0.0);
      at::Tensor m = local_mean.to(at::kDouble);
      stats.narrow(0, 0, c).copy_(m * double(n));
      stats.narrow(0, c, c).copy_((local_var.to(at::kDouble) + m * m) * double(n));
      stats[2 * c].fill_(double(n));
    }
    all_reduce(stats, ReduceOp::SUM, {group, std::nullopt});
    const double total = stats[2 * c].item<double>();
    if (total <= 1) {
      throw InvalidArgument(fmt::format(
          "SyncBatchNorm({}): expected more than 1 value per channel when training, got {} "
          "over the group of {} ranks (this rank's input: {}); use a larger batch or eval()",
          c, total, group->size(), detail::describe_tensor(input)));
    }
    at::Tensor mean = stats.narrow(0, 0, c) / total;
    at::Tensor var = (stats.narrow(0, c, c) / total - mean * mean).clamp_min(0);
    at::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.numel() > 0) {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()) * momentum);
      running_var.mul_(1 - momentum)
          .add_((var * (total / (total - 1))).to(running_var.scalar_type()) * momentum);
    }
    const bool affine = weight.numel() > 0;
    at::Tensor scale = affine ? invstd * weight.to(at::kDouble) : invstd;
    at::Tensor shift = -mean * scale;
    if (affine) shift = shift + bias.to(at::kDouble);
    at::Tensor out = at::addcmul(per_channel(shift.to(ct), input.dim()), x,
                                 per_channel(scale.to(ct), input.dim()))
                         .to(dt);
    // Saved in the parameters' precision (float32 for float16/bfloat16
    // inputs), as BatchNorm's kernels take them.
    const auto pdt = dt == at::kDouble ? at::kDouble : at::kFloat;
    ctx->save_for_backward({input, weight, mean.to(pdt), invstd.to(pdt)});
    ctx->saved_data["total"] = total;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const bool affine = weight.numel() > 0;
    const int64_t c = input.size(1);
    at::Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(input);
    // This rank's per-channel sum(dy) and sum(dy * (x - mean)) * invstd,
    // with the group's mean and invstd: BatchNorm's backward kernel, one
    // pass, computing only its weight and bias gradients.
    at::Tensor sum_dy, sum_dy_xhat;
    if (input.numel() > 0) {
      // A weight of ones: the kernel's weight gradient does not depend on
      // it, but CUDA's allocates that gradient like the weight.
      auto grads_wb = at::native_batch_norm_backward(dy, input, at::ones({c}, mean.options()), {},
                                                     {}, mean, invstd, /*train=*/true, 0.0,
                                                     {false, true, true});
      sum_dy_xhat = std::get<1>(grads_wb);
      sum_dy = std::get<2>(grads_wb);
    } else {
      sum_dy_xhat = at::zeros({c}, mean.options());
      sum_dy = at::zeros({c}, mean.options());
    }

    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      auto group = ctx->saved_data["group"].toCapsule();
      at::Tensor both = at::cat({sum_dy, sum_dy_xhat}).to(at::kDouble);
      all_reduce(both, ReduceOp::SUM,
                 {static_cast<GroupHolder*>(group.get())->group, std::nullopt});
      grad_input = input_gradient(dy, input, weight, mean, invstd,
                                  ctx->saved_data["total"].toDouble(), both);
    }
    if (affine && ctx->needs_input_grad(1)) grad_weight = sum_dy_xhat.to(weight.scalar_type());
    if (affine && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_,
                                     ProcessGroupPtr process_group_)
    : options(options_), process_group(std::move(process_group_)) {
  if (options.num_features() <= 0) {
    throw InvalidArgument(fmt::format(
        "SyncBatchNorm: num_features must be positive, got {}", options.num_features()));
  }
  SyncBatchNormImpl::reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  weight = register_parameter("weight", options.affine() ? at::empty({c}) : at::Tensor(),
                              options.affine());
  bias = register_parameter("bias", options.affine() ? at::empty({c}) : at::Tensor(),
                            options.affine());
  const bool track = options.track_running_stats();
  running_mean = register_buffer("running_mean", track ? at::zeros({c}) : at::Tensor());
  running_var = register_buffer("running_var", track ? at::ones({c}) : at::Tensor());
  num_batches_tracked = register_buffer(
      "num_batches_tracked", track ? at::zeros({}, at::kLong) : at::Tensor());
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::nn::init::ones_(weight);
  torch::nn::init::zeros_(bias);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddp::SyncBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

void SyncBatchNormImpl::share_state(const at::Tensor& weight_, const at::Tensor& bias_,
                                    const at::Tensor& running_mean_,
                                    const at::Tensor& running_var_,
                                    const at::Tensor& num_batches_tracked_) {
  const int64_t c = options.num_features();
  auto check = [&](const at::Tensor& t, bool wanted, const char* what) {
    const bool scalar = std::string(what) == "num_batches_tracked";
    const bool shaped = scalar ? t.dim() == 0 : t.dim() == 1 && t.numel() == c;
    if (t.defined() != wanted || (t.defined() && !shaped)) {
      throw InvalidArgument(fmt::format(
          "SyncBatchNorm({}).share_state: {} must be {}, got {}", c, what,
          !wanted ? "undefined (affine/track_running_stats are off)"
          : scalar ? "a scalar"
                   : fmt::format("a tensor of {} elements", c),
          detail::describe_tensor(t)));
    }
  };
  check(weight_, options.affine(), "weight");
  check(bias_, options.affine(), "bias");
  check(running_mean_, options.track_running_stats(), "running_mean");
  check(running_var_, options.track_running_stats(), "running_var");
  check(num_batches_tracked_, options.track_running_stats(), "num_batches_tracked");
  // Parameters: the very tensors (an optimizer holds them, gradients land
  // in them). Buffers: Module keeps its buffer table private, so the
  // registered tensors take the given ones' data (storage, dtype, device)
  // instead, as Module::to() does.
  parameters_["weight"] = weight = weight_;
  parameters_["bias"] = bias = bias_;
  if (!options.track_running_stats()) return;
  running_mean.set_data(running_mean_);
  running_var.set_data(running_var_);
  num_batches_tracked.set_data(num_batches_tracked_);
}

void SyncBatchNormImpl::check_input(const at::Tensor& input) const {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    throw InvalidArgument(fmt::format(
        "SyncBatchNorm({}): expected an N x {} x * input (at least 2 dimensions, channels "
        "in dimension 1), got {}",
        options.num_features(), options.num_features(), detail::describe_tensor(input)));
  }
  if (!at::isFloatingType(input.scalar_type())) {
    throw InvalidArgument(fmt::format("SyncBatchNorm({}): expected a floating-point input, got {}",
                                      options.num_features(), detail::describe_tensor(input)));
  }
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  check_input(input);
  // As BatchNorm: an unset momentum is the cumulative average over batches.
  double factor = options.momentum().value_or(0.0);
  const bool track = options.track_running_stats();
  if (is_training() && track) {
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  ProcessGroupPtr g = process_group;
  if (is_training() && !g && is_initialized()) g = default_group();
  if (!is_training() || !g || g->size() == 1) {
    return torch::nn::functional::detail::batch_norm(
        input, running_mean, running_var, weight, bias, is_training() || !track, factor,
        options.eps());
  }
  // Function::apply takes no undefined tensors: absent ones travel as
  // 0-element placeholders (a present one has C > 0 elements).
  auto present = [](const at::Tensor& t) { return t.defined() ? t : at::empty({0}); };
  return SyncBatchNormFunction::apply(input, present(weight), present(bias), present(running_mean),
                                      present(running_var), options.eps(), factor, g);
}

namespace {

// A SyncBatchNorm with `bn`'s options, mode and tensors; null when `m` is
// not a BatchNorm{1,2,3}d.
template <typename Impl>
std::shared_ptr<SyncBatchNormImpl> sync_from(const std::shared_ptr<torch::nn::Module>& m,
                                             const ProcessGroupPtr& group) {
  auto bn = std::dynamic_pointer_cast<Impl>(m);
  if (!bn) return nullptr;
  auto sync = std::make_shared<SyncBatchNormImpl>(bn->options, group);
  sync->share_state(bn->weight, bn->bias, bn->running_mean, bn->running_var,
                    bn->num_batches_tracked);
  sync->train(bn->is_training());
  return sync;
}

std::shared_ptr<SyncBatchNormImpl> sync_from_any(const std::shared_ptr<torch::nn::Module>& m,
                                                 const ProcessGroupPtr& group) {
  if (auto s = sync_from<torch::nn::BatchNorm1dImpl>(m, group)) return s;
  if (auto s = sync_from<torch::nn::BatchNorm2dImpl>(m, group)) return s;
  return sync_from<torch::nn::BatchNorm3dImpl>(m, group);
}

struct Swap {
  torch::nn::SequentialImpl* sequential;
  std::string name;
  std::shared_ptr<torch::nn::Module> old_layer;
  std::shared_ptr<SyncBatchNormImpl> new_layer;
};

// Finds every BatchNorm under `m` (named from `path`), refusing one that is
// not a Sequential's element. Changes nothing.
void find_swaps(torch::nn::Module& m, const std::string& path, const ProcessGroupPtr& group,
                std::vector<Swap>& swaps) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&m);
  for (const auto& child : m.named_children()) {
    const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
    auto sync = sync_from_any(child.value(), group);
    if (!sync) {
      find_swaps(*child.value(), child_path, group, swaps);
      continue;
    }
    if (!sequential) {
      throw InvalidArgument(fmt::format(
          "convert_sync_batchnorm: '{}' is a {} held by {}, whose forward() calls the layer "
          "object it holds, which no function can swap in libtorch (PyTorch reassigns the "
          "attribute); declare it as ddp::SyncBatchNorm, or keep it in a "
          "torch::nn::Sequential. Nothing was converted.",
          child_path, child.value()->name(), m.name()));
    }
    swaps.push_back({sequential, child.key(), child.value(), std::move(sync)});
  }
}

}  // namespace

int convert_sync_batchnorm(torch::nn::Module& module, ProcessGroupPtr process_group) {
  if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(&module) ||
      dynamic_cast<torch::nn::BatchNorm2dImpl*>(&module) ||
      dynamic_cast<torch::nn::BatchNorm3dImpl*>(&module)) {
    throw InvalidArgument(fmt::format(
        "convert_sync_batchnorm: the module itself is a {}, which cannot be replaced in "
        "place; construct ddp::SyncBatchNorm(bn->options) and share_state() instead",
        module.name()));
  }
  std::vector<Swap> swaps;
  find_swaps(module, "", process_group, swaps);
  // A layer reachable twice (a shared Sequential, or one layer at two
  // places) gets one replacement, installed once per place.
  std::map<torch::nn::Module*, std::shared_ptr<SyncBatchNormImpl>> replacement;
  std::set<std::pair<torch::nn::SequentialImpl*, std::string>> done;
  for (Swap& s : swaps) {
    auto& sync = replacement[s.old_layer.get()];
    if (!sync) sync = s.new_layer;
    if (!done.insert({s.sequential, s.name}).second) continue;
    for (auto it = s.sequential->begin(); it != s.sequential->end(); ++it) {
      if (it->ptr() == s.old_layer) *it = torch::nn::AnyModule(sync);
    }
    s.sequential->replace_module(s.name, sync);
  }
  return static_cast<int>(replacement.size());
}

}  // namespace ddp
