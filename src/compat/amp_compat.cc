#include "compat/amp_compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/isfinite.h>
#include <torch/version.h>

#include <cmath>

namespace ddp::compat {

#if TORCH_VERSION_MAJOR >= 2

bool autocast_enabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }

at::ScalarType autocast_dtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}

void set_autocast(c10::DeviceType device, bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
}

void amp_unscale_(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                  const at::Tensor& inv_scale) {
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

void amp_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                         growth_interval);
}

#else  // libtorch 1.13

bool autocast_enabled(c10::DeviceType device) {
  return device == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}

at::ScalarType autocast_dtype(c10::DeviceType device) {
  return device == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                             : at::autocast::get_autocast_gpu_dtype();
}

void set_autocast(c10::DeviceType device, bool enabled, at::ScalarType dtype) {
  if (device == c10::kCPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}

void amp_unscale_(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                  const at::Tensor& inv_scale) {
  if (grads.empty()) return;
  if (!grads.front().is_cpu()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  // ATen's CPU kernel (2.x): found_inf = 1 if any element is not finite;
  // every element multiplied by inv_scale in float (opmath) and rounded to
  // the tensor's dtype.
  const float inv = inv_scale.item<float>();
  for (at::Tensor& g : grads) {
    if (!at::isfinite(g).all().item<bool>()) found_inf.fill_(1.0);
    if (g.scalar_type() == at::kFloat) {
      g.mul_(inv);
    } else {
      g.copy_(g.to(at::kFloat).mul_(inv));
    }
  }
}

void amp_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (!scale.is_cpu()) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
    return;
  }
  // ATen's CPU kernel (2.x): the products in double, stored as float.
  float s = scale.item<float>();
  int32_t tracker = growth_tracker.item<int32_t>();
  if (found_inf.item<float>() > 0) {
    s = static_cast<float>(s * backoff_factor);
    tracker = 0;
  } else if (tracker + 1 == growth_interval) {
    const float grown = static_cast<float>(s * growth_factor);
    if (std::isfinite(grown)) s = grown;
    tracker = 0;
  } else {
    tracker += 1;
  }
  scale.fill_(s);
  growth_tracker.fill_(tracker);
}

#endif

}  // namespace ddp::compat
