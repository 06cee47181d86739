// Internal: the parameter swap of DDP's mixed precision (MixedPrecision in
// distributed_data_parallel.h; PyTorch's _setup_mixed_precision_params and
// its root pre-forward hook).
//
// Note [Mixed-precision parameters]
// A libtorch module reads its parameters through the very tensors it
// registered (this->weight), so the low-precision copy must live in those
// tensors: cast() swaps each parameter's data for a param_dtype copy
// (Tensor::set_data, Python's `param.data = ...`), keeping the
// full-precision data aside; restore() swaps it back. The tensors the
// optimizer holds stay the same objects throughout, so its state still
// finds them. Changing a tensor's dtype gives it a new gradient
// accumulator (autograd drops the old one), so the reducer re-attaches its
// hooks after every cast (Reducer::refresh_hooks). Gradients follow their
// parameter: cast down with it (accumulation continues in param_dtype, as
// in PyTorch) and up again at restore().
// cast() while already cast does nothing: two forwards before one backward
// share one copy, hence one gradient accumulator per parameter.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <vector>

#include "ddp/distributed_data_parallel.h"

namespace ddp::detail {

// Throws InvalidArgument naming the field: a non-floating dtype in
// options.mixed_precision, or param/reduce dtype with
// gradient_as_bucket_view.
void check_mixed_precision(const DistributedDataParallelOptions& options);

class MixedPrecisionParams {
 public:
  // params: every parameter of the model, each once; the floating-point
  // ones are swapped.
  MixedPrecisionParams(const std::vector<at::Tensor>& params, c10::ScalarType param_dtype);

  // Swaps in param_dtype copies of the current full-precision values (and
  // casts defined gradients). Returns whether anything changed (the
  // reducer must then refresh its hooks).
  bool cast();
  // Swaps the full-precision data back and casts defined gradients to the
  // parameters' own dtype. No-op when not cast.
  void restore();
  bool is_cast() const { return cast_; }

 private:
  struct Entry {
    at::Tensor param;  // the model's tensor (same object throughout)
    at::Tensor full;   // its full-precision data while cast
  };
  std::vector<Entry> entries_;
  c10::ScalarType low_;
  bool cast_ = false;
};

}  // namespace ddp::detail
