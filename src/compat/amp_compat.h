// Mixed precision's version differences (libtorch 2.x against Debian's
// 1.13): the autocast state of the calling thread, and the two ATen kernels
// of GradScaler, which 1.13 has for CUDA only. Everything else of src/amp/
// is the same on every version.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <vector>

namespace ddp::compat {

// The calling thread's autocast settings for one device type (CPU or CUDA),
// as Python's torch.is_autocast_enabled(device), torch.get_autocast_dtype(
// device); 2.x: at::autocast's per-device functions, 1.13: its CPU and GPU
// ones.
bool autocast_enabled(c10::DeviceType device);
at::ScalarType autocast_dtype(c10::DeviceType device);
void set_autocast(c10::DeviceType device, bool enabled, at::ScalarType dtype);

// torch._amp_foreach_non_finite_check_and_unscale_: multiplies every tensor
// of `grads` (one device and dtype) by `inv_scale` (a float32 scalar tensor)
// in place, and sets `found_inf` (a float32 scalar tensor) to 1 when any
// element of any of them is inf or NaN (it is never reset to 0 here).
// ATen's kernel where this libtorch has one for the device; on 1.13's CPU
// the same arithmetic (a multiplication in the tensor's dtype by the float
// inv_scale) with ATen's own operations.
void amp_unscale_(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                  const at::Tensor& inv_scale);

// torch._amp_update_scale_: with found_inf > 0, scale *= backoff_factor and
// growth_tracker = 0; else growth_tracker += 1, and when it reaches
// growth_interval, scale *= growth_factor (kept only if finite) and
// growth_tracker = 0. scale: float32 scalar tensor, growth_tracker: int32.
void amp_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace ddp::compat
