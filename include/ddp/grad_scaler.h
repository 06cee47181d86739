// GradScaler: dynamic loss scaling for float16 training, with the semantics,
// defaults and arithmetic of PyTorch's torch.amp.GradScaler.
//
// float16 gradients underflow; the loss is multiplied by a scale before
// backward, the gradients divided by it before the optimizer steps, and a
// step whose gradients hold an inf or NaN (the scale was too large) is
// skipped and the scale halved; after growth_interval steps without one it
// doubles. bfloat16 has float32's range and needs no scaler.
//
//   ddp::GradScaler scaler;                          // init_scale 2^16
//   for (...) {
//     opt.zero_grad();
//     at::Tensor loss;
//     {
//       ddp::AutocastGuard autocast(c10::kCUDA, at::kHalf);
//       loss = loss_fn(model(x), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                          // optional: to clip
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);                              // skipped on inf/NaN
//     scaler.update();
//   }
//
// The arithmetic is ATen's own (_amp_foreach_non_finite_check_and_unscale_,
// _amp_update_scale_; on libtorch 1.13's CPU, which lacks them, the same
// operations written out: src/compat/amp_compat.h), so scale, skipped steps
// and parameters equal Python's step for step. CPU and CUDA tensors; the
// scale lives on the device of the first tensor scaled.
//
// Data parallel: under DistributedDataParallel every rank sees the same
// averaged gradients, hence the same inf check and the same skipped steps,
// with no communication. When the ranks hold different gradients (a
// ShardedOptimizer such as ZeroRedundancyOptimizer without DDP's averaging,
// sharded parameters, or any GradScalerOptions::process_group), the inf
// flag is all-reduced (MAX) over the group before a step, so that no rank
// steps while another skips (PyTorch's ShardedGradScaler): a collective,
// inside step() (or unscale_()).
//
// Not thread-safe: one training thread uses a scaler. The optimizers are
// known by address: per step, each is unscaled at most once (a second
// unscale_ is the same error as PyTorch's) and stepped at most once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16, as PyTorch
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // > 0 steps without inf/NaN before growing
  bool enabled = true;             // false: every method passes through
  // Combine the inf check over this group (see above). null: only for a
  // ShardedOptimizer, over its group.
  ProcessGroupPtr process_group;
};

// What state_dict() holds (PyTorch's keys: scale, growth_factor,
// backoff_factor, growth_interval, _growth_tracker). Empty (scale 0) for a
// disabled scaler, as Python's {}.
struct GradScalerState {
  double scale = 0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;
  // "scale=65536 growth_factor=2 backoff_factor=0.5 growth_interval=2000
  // growth_tracker=0": kept in a checkpoint's metadata (SaveOptions::
  // metadata["grad_scaler"]) and parsed back exactly (17 digits).
  std::string to_string() const;
  // Throws InvalidArgument naming the text when it is not one: each of the
  // five fields exactly once, each value a whole number (interval,
  // tracker) or a number (the rest). from_string(s.to_string()) == s.
  static GradScalerState from_string(const std::string& text);
};

class GradScaler {
 public:
  // Throws InvalidArgument naming the option when growth_factor <= 1,
  // backoff_factor outside (0, 1), growth_interval < 1 or init_scale <= 0.
  explicit GradScaler(GradScalerOptions options = {});
  ~GradScaler();
  GradScaler(GradScaler&&) noexcept;
  GradScaler& operator=(GradScaler&&) noexcept;

  // outputs * scale (a float32 scalar, created on outputs' device at the
  // first call); outputs unchanged when disabled.
  at::Tensor scale(const at::Tensor& outputs);
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  // Divides the optimizer's gradients by the scale in place and records
  // whether any is inf/NaN. At most once per optimizer between update()s:
  // a second call throws InvalidArgument ("unscale_() has already been
  // called on this optimizer since the last update()"), as does a call after
  // step(). float16 gradients are refused (PyTorch's "Attempting to unscale
  // FP16 gradients"): keep the parameters in float32. Sparse gradients:
  // InvalidArgument.
  void unscale_(torch::optim::Optimizer& optimizer);

  // Unscales (unless unscale_ ran) and calls optimizer.step() when no
  // gradient was inf/NaN; returns whether it stepped. Once per optimizer
  // between update()s (InvalidArgument otherwise). Throws InvalidArgument
  // when scale() was never called (PyTorch's assertion, "did not use
  // scaler.scale(loss)"). Disabled: optimizer.step(), true.
  bool step(torch::optim::Optimizer& optimizer);

  // The end of the iteration: the scale backs off after a skipped step,
  // grows after growth_interval good ones (or takes new_scale), and every
  // optimizer's state is reset for the next iteration.
  void update(std::optional<double> new_scale = std::nullopt);

  // The current scale (waits for the device), init_scale before the first
  // scale(); 1.0 when disabled, as PyTorch.
  double get_scale() const;
  double get_growth_factor() const { return options_.growth_factor; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  int64_t get_growth_interval() const { return options_.growth_interval; }
  void set_growth_factor(double v);
  void set_backoff_factor(double v);
  void set_growth_interval(int64_t v);
  bool is_enabled() const { return options_.enabled; }

  GradScalerState state_dict() const;
  // Takes a state_dict(); InvalidArgument for an empty one (as PyTorch's
  // "The source state dict is empty"), and, unlike PyTorch, for one no
  // scaler reaches (a scale or growth factor that is not finite, a
  // negative tracker, the factors and interval the options refuse), so that
  // a damaged checkpoint does not skip every step. Applies at the next
  // scale().
  void load_state_dict(const GradScalerState& state);

 private:
  struct PerOptimizer;
  void check_initialized(const char* method) const;
  void unscale_grads(torch::optim::Optimizer& optimizer, PerOptimizer& state);
  void combine_over(const ProcessGroupPtr& group, PerOptimizer& state);

  GradScalerOptions options_;
  at::Tensor scale_, growth_tracker_;       // lazily made at the first scale()
  std::optional<GradScalerState> pending_;  // load_state_dict before the first scale()
  std::map<const torch::optim::Optimizer*, std::unique_ptr<PerOptimizer>> per_optimizer_;
};

}  // namespace ddp
