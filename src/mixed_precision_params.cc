// MixedPrecisionParams: see Note [Mixed-precision parameters].
#include "mixed_precision_params.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <utility>

#include "ddp/error.h"

namespace ddp::detail {

void check_mixed_precision(const DistributedDataParallelOptions& options) {
  if (const auto& mp = options.mixed_precision) {
    const std::pair<const char*, std::optional<c10::ScalarType>> fields[] = {
        {"param_dtype", mp->param_dtype},
        {"reduce_dtype", mp->reduce_dtype},
        {"buffer_dtype", mp->buffer_dtype}};
    for (const auto& [field, dtype] : fields) {
      if (dtype && !c10::isFloatingType(*dtype)) {
        throw InvalidArgument(fmt::format(
            "DistributedDataParallelOptions::mixed_precision.{} is {}; it must be a "
            "floating-point dtype (at::kBFloat16, at::kHalf, at::kFloat, at::kDouble) "
            "or unset",
            field, c10::toString(*dtype)));
      }
    }
    if (options.gradient_as_bucket_view && (mp->param_dtype || mp->reduce_dtype)) {
      throw InvalidArgument(
          "DistributedDataParallelOptions: gradient_as_bucket_view cannot be combined with "
          "mixed_precision.param_dtype or reduce_dtype (a .grad() in the parameters' dtype "
          "cannot be a view into a bucket of another dtype); turn one of them off");
    }
  }
}

MixedPrecisionParams::MixedPrecisionParams(const std::vector<at::Tensor>& params,
                                           c10::ScalarType param_dtype)
    : low_(param_dtype) {
  for (const at::Tensor& p : params) {
    if (p.is_floating_point() && p.scalar_type() != low_) entries_.push_back({p, at::Tensor()});
  }
}

bool MixedPrecisionParams::cast() {
  if (cast_ || entries_.empty()) return false;
  at::NoGradGuard no_grad;
  for (Entry& e : entries_) {
    e.full = e.param.data();  // shares the storage; survives the swap
    e.param.set_data(e.full.to(low_));
    at::Tensor& grad = e.param.mutable_grad();
    if (grad.defined()) grad = grad.to(low_);
  }
  cast_ = true;
  return true;
}

void MixedPrecisionParams::restore() {
  if (!cast_) return;
  at::NoGradGuard no_grad;
  for (Entry& e : entries_) {
    e.param.set_data(e.full);
    at::Tensor& grad = e.param.mutable_grad();
    if (grad.defined()) grad = grad.to(e.full.scalar_type());
    e.full = at::Tensor();
  }
  cast_ = false;
}

}  // namespace ddp::detail
