// GradScaler (include/ddp/grad_scaler.h): torch.amp.GradScaler's steps, in
// its order, on ATen's kernels (compat/amp_compat.h).
#include "ddp/grad_scaler.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "compat/amp_compat.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "ddp/optimizer_state.h"

namespace ddp {

// PyTorch's per-optimizer state: READY -> (UNSCALED) -> STEPPED, back to
// READY at update(), and the inf flag of each device its gradients are on.
struct GradScaler::PerOptimizer {
  enum class Stage { kReady, kUnscaled, kStepped } stage = Stage::kReady;
  // Per device its gradients are on: a float32 scalar there.
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf;

  at::Tensor& flag(const c10::Device& device) {
    for (auto& [d, t] : found_inf) {
      if (d == device) return t;
    }
    found_inf.emplace_back(device, at::zeros({}, at::TensorOptions().device(device)));
    return found_inf.back().second;
  }
};

namespace {

void check_factors(double growth, double backoff) {
  if (!(growth > 1.0)) {
    throw InvalidArgument(
        fmt::format("GradScalerOptions::growth_factor must be > 1, got {}", growth));
  }
  if (!(backoff > 0.0 && backoff < 1.0)) {
    throw InvalidArgument(
        fmt::format("GradScalerOptions::backoff_factor must be in (0, 1), got {}", backoff));
  }
}

void check_interval(int64_t interval) {
  if (interval < 1) {
    throw InvalidArgument(
        fmt::format("GradScalerOptions::growth_interval must be >= 1, got {}", interval));
  }
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)) {
  if (!options_.enabled) return;
  check_factors(options_.growth_factor, options_.backoff_factor);
  check_interval(options_.growth_interval);
  if (!(options_.init_scale > 0) || !std::isfinite(options_.init_scale)) {
    throw InvalidArgument(fmt::format("GradScalerOptions::init_scale must be a positive number, "
                                      "got {}", options_.init_scale));
  }
}

GradScaler::~GradScaler() = default;
GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled) return outputs;
  if (!scale_.defined()) {
    const auto on = at::TensorOptions().device(outputs.device());
    const double init = pending_ ? pending_->scale : options_.init_scale;
    const int64_t tracker = pending_ ? pending_->growth_tracker : 0;
    scale_ = at::full({}, init, on.dtype(at::kFloat));
    growth_tracker_ = at::full({}, tracker, on.dtype(at::kInt));
    pending_.reset();
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  for (const at::Tensor& t : outputs) out.push_back(scale(t));
  return out;
}

void GradScaler::check_initialized(const char* method) const {
  if (!scale_.defined()) {
    throw InvalidArgument(fmt::format(
        "GradScaler::{}: no scale yet. This may indicate your program did not use "
        "scaler.scale(loss) earlier in the iteration (PyTorch's assertion)",
        method));
  }
}

// Unscales the optimizer's gradients per device and dtype, as PyTorch's
// _unscale_grads_, and records the inf flag of each device that has some.
void GradScaler::unscale_grads(torch::optim::Optimizer& optimizer, PerOptimizer& state) {
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  // Per device and dtype, in the order first met (ATen's kernel takes one
  // device and dtype per call).
  std::vector<std::pair<std::pair<c10::Device, at::ScalarType>, std::vector<at::Tensor>>> grads;
  for (auto& group : optimizer.param_groups()) {
    for (at::Tensor& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (g.scalar_type() == at::kHalf) {
        throw InvalidArgument(
            "GradScaler::unscale_: a float16 gradient (PyTorch's \"Attempting to unscale FP16 "
            "gradients\"): keep the parameters in float32 and let autocast run the forward in "
            "float16");
      }
      if (g.is_sparse()) {
        throw InvalidArgument("GradScaler::unscale_: sparse gradients are not supported");
      }
      const std::pair<c10::Device, at::ScalarType> key{g.device(), g.scalar_type()};
      auto it = std::find_if(grads.begin(), grads.end(), [&](const auto& e) { return e.first == key; });
      if (it == grads.end()) it = grads.insert(grads.end(), {key, {}});
      it->second.push_back(g);
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [key, list] : grads) {
    const c10::Device device = key.first;
    compat::amp_unscale_(list, state.flag(device), inv_scale.to(device, /*non_blocking=*/true));
  }
}

// Ranks with different gradients agree on one flag (ShardedGradScaler):
// every rank joins the all_reduce, with zero where it has no gradient.
void GradScaler::combine_over(const ProcessGroupPtr& group, PerOptimizer& state) {
  at::Tensor any = at::zeros({}, scale_.options());
  for (const auto& [device, flag] : state.found_inf) any.add_(flag.to(scale_.device()));
  all_reduce(any, ReduceOp::MAX, CollectiveOptions{group, std::nullopt});
  state.found_inf.clear();
  state.found_inf.emplace_back(scale_.device(), any);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  check_initialized("unscale_");
  auto& slot = per_optimizer_[&optimizer];
  if (!slot) slot = std::make_unique<PerOptimizer>();
  PerOptimizer& state = *slot;
  if (state.stage == PerOptimizer::Stage::kUnscaled) {
    throw InvalidArgument(
        "GradScaler::unscale_() has already been called on this optimizer since the last "
        "update() (as PyTorch: once per optimizer per step)");
  }
  if (state.stage == PerOptimizer::Stage::kStepped) {
    throw InvalidArgument("GradScaler::unscale_() is being called after step()");
  }
  unscale_grads(optimizer, state);
  ProcessGroupPtr group = options_.process_group;
  if (!group) {
    if (auto* sharded = dynamic_cast<const ShardedOptimizer*>(&optimizer)) group = sharded->group();
  }
  if (group && group->size() > 1) combine_over(group, state);
  state.stage = PerOptimizer::Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  check_initialized("step");
  auto& slot = per_optimizer_[&optimizer];
  if (!slot) slot = std::make_unique<PerOptimizer>();
  if (slot->stage == PerOptimizer::Stage::kStepped) {
    throw InvalidArgument("GradScaler::step() has already been called since the last update()");
  }
  if (slot->stage == PerOptimizer::Stage::kReady) unscale_(optimizer);
  PerOptimizer& state = *per_optimizer_.at(&optimizer);
  if (state.found_inf.empty()) {
    throw InvalidArgument(
        "GradScaler::step: no inf checks were recorded for this optimizer (none of its "
        "parameters has a gradient; PyTorch's assertion)");
  }
  double found = 0;
  for (const auto& [device, flag] : state.found_inf) found += flag.item<double>();
  state.stage = PerOptimizer::Stage::kStepped;
  if (found != 0) return false;
  optimizer.step();
  return true;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled) return;
  check_initialized("update");
  if (new_scale) {
    scale_.fill_(*new_scale);
  } else {
    at::Tensor found = at::zeros({}, scale_.options());
    size_t flags = 0;
    for (const auto& [opt, state] : per_optimizer_) {
      for (const auto& [device, flag] : state->found_inf) {
        found.add_(flag.to(scale_.device(), /*non_blocking=*/true));
        ++flags;
      }
    }
    if (flags == 0) {
      throw InvalidArgument(
          "GradScaler::update: no inf checks were recorded prior to update (no step() or "
          "unscale_() since the last update; PyTorch's assertion)");
    }
    compat::amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor,
                              options_.backoff_factor, options_.growth_interval);
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  if (!scale_.defined()) return pending_ ? pending_->scale : options_.init_scale;
  return scale_.item<double>();
}

void GradScaler::set_growth_factor(double v) {
  check_factors(v, options_.backoff_factor);
  options_.growth_factor = v;
}

void GradScaler::set_backoff_factor(double v) {
  check_factors(options_.growth_factor, v);
  options_.backoff_factor = v;
}

void GradScaler::set_growth_interval(int64_t v) {
  check_interval(v);
  options_.growth_interval = v;
}

GradScalerState GradScaler::state_dict() const {
  GradScalerState s;
  if (!options_.enabled) return s;
  s.scale = get_scale();
  s.growth_factor = options_.growth_factor;
  s.backoff_factor = options_.backoff_factor;
  s.growth_interval = options_.growth_interval;
  s.growth_tracker = growth_tracker_.defined() ? growth_tracker_.item<int64_t>()
                     : pending_                ? pending_->growth_tracker
                                               : 0;
  return s;
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled) return;
  // A damaged state would not fail later: an infinite scale makes every
  // step look overflowed, and every step would be skipped without a word.
  if (!std::isfinite(state.scale) || state.scale < 0 || !std::isfinite(state.growth_factor) ||
      state.growth_tracker < 0) {
    throw InvalidArgument(fmt::format(
        "GradScaler::load_state_dict: not a state a GradScaler reaches (scale {}, growth_factor "
        "{}, growth_tracker {}): the source is damaged",
        state.scale, state.growth_factor, state.growth_tracker));
  }
  if (!(state.scale > 0)) {
    throw InvalidArgument("GradScaler::load_state_dict: the source state is empty (a disabled "
                          "scaler's, scale 0)");
  }
  check_factors(state.growth_factor, state.backoff_factor);
  check_interval(state.growth_interval);
  options_.growth_factor = state.growth_factor;
  options_.backoff_factor = state.backoff_factor;
  options_.growth_interval = state.growth_interval;
  if (scale_.defined()) {
    scale_.fill_(state.scale);
    growth_tracker_.fill_(state.growth_tracker);
  } else {
    pending_ = state;
  }
}

}  // namespace ddp
