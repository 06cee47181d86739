// AutocastGuard (include/ddp/autocast.h): what torch.autocast's __enter__
// and __exit__ do, in the same order.
#include "ddp/autocast.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "compat/amp_compat.h"
#include "ddp/error.h"
#include "ddp/logging.h"

namespace ddp {
namespace {

// Whether autocast can run for `device` with `dtype`; false (and a warning)
// for CUDA without a GPU, as Python; throws for what Python refuses, and for
// the dtypes it would silently disable.
bool usable(c10::DeviceType device, at::ScalarType dtype) {
  if (device != c10::kCPU && device != c10::kCUDA) {
    throw InvalidArgument(fmt::format(
        "AutocastGuard: device type {} is not supported; use c10::kCPU or c10::kCUDA",
        c10::DeviceTypeName(device)));
  }
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw InvalidArgument(fmt::format(
        "AutocastGuard: dtype {} is not an autocast dtype; use at::kBFloat16 or at::kHalf "
        "(Python's torch.autocast warns and turns autocast off for it)",
        c10::toString(dtype)));
  }
  if (device == c10::kCUDA && !torch::cuda::is_available()) {
    log(LogLevel::kWarning,
        "ddp: AutocastGuard(kCUDA): CUDA is not available; autocast stays off (as Python's "
        "torch.autocast)");
    return false;
  }
  return true;
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device_type, AutocastOptions options)
    : device_(device_type) {
  const at::ScalarType dtype = options.dtype.value_or(compat::autocast_dtype(device_type));
  const bool enabled = options.enabled && usable(device_type, dtype);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  previous_enabled_ = compat::autocast_enabled(device_type);
  previous_dtype_ = compat::autocast_dtype(device_type);
  compat::set_autocast(device_type, enabled, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(options.cache_enabled.value_or(previous_cache_enabled_));
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled)
    : AutocastGuard(device_type, AutocastOptions{dtype, enabled, std::nullopt}) {}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast(device_, previous_enabled_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  return compat::autocast_enabled(device_type);
}

at::ScalarType get_autocast_dtype(c10::DeviceType device_type) {
  return compat::autocast_dtype(device_type);
}

}  // namespace ddp
