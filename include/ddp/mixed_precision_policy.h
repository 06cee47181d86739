// MixedPrecisionPolicy: fully_shard's per-unit mixed precision (PyTorch
// FSDP2's torch.distributed.fsdp.MixedPrecisionPolicy), and the casts a
// unit's forward applies to its arguments and outputs
// (include/ddp/fully_shard.h; docs/fully_shard.md, "Mixed precision").
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace ddp {

// FSDP2's MixedPrecisionPolicy, per unit: module-level mixed precision
// (not autocast's per-op casts). The shards, the optimizer's step and the
// shard gradients stay in the parameters' own dtype (float32, say); only
// the gathered parameters, the unit's computation and the collectives use
// the lower precision.
struct MixedPrecisionPolicy {
  // The gathered parameters' dtype, hence the forward's and backward's
  // computation and the all-gather's (the shard is cast, then gathered).
  // nullopt: the parameters' own. Ignored for non-floating parameters.
  std::optional<at::ScalarType> param_dtype;
  // The reduce-scatter's dtype (and the dtype in which gradients summed with
  // sync off are kept). nullopt: the computation's (param_dtype). The
  // reduced shard is cast to the parameters' dtype and added to .grad().
  // float32 and bfloat16 reduce with AVG; other dtypes (float16) divide by
  // about sqrt(world_size) before a SUM and by the rest after it, as FSDP2
  // does to keep float16 from overflowing.
  std::optional<at::ScalarType> reduce_dtype;
  // Floating-point tensors forward returns are cast to it (a Tensor, a
  // std::vector or std::tuple of them; other output types with an
  // output_dtype: InvalidArgument at the forward). nullopt: left as they are.
  // Set it on the root (so the loss sees float32): on an inner unit, only
  // where whatever reads its output casts it (another unit's
  // cast_forward_inputs); the parent's own layers would see a dtype unlike
  // their parameters' ("mat1 and mat2 must have the same dtype").
  std::optional<at::ScalarType> output_dtype;
  // Cast forward's floating-point tensor arguments (those passed directly,
  // not inside containers) to param_dtype before the unit's forward.
  bool cast_forward_inputs = true;
};

namespace detail {

// cast_forward_inputs: a floating-point tensor argument cast to `dtype`
// into `slot` (left undefined when the argument is not cast).
template <typename T>
void fsdp_cast_arg(const T& arg, at::Tensor& slot, const std::optional<at::ScalarType>& dtype) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    if (dtype && arg.defined() && arg.is_floating_point() && arg.scalar_type() != *dtype) {
      slot = arg.to(*dtype);
    }
  }
}
// The argument forward receives: the cast in `slot`, with the argument's
// own reference kind, or the argument itself.
template <typename T>
decltype(auto) fsdp_pass_arg(std::remove_reference_t<T>& arg, at::Tensor& slot) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return static_cast<T&&>(slot.defined() ? slot : arg);
  } else {
    return static_cast<T&&>(arg);
  }
}
// output_dtype: casts the floating-point tensors of forward's output in
// place; false when the output type is not one it can reach.
inline bool fsdp_cast_output(at::Tensor& t, at::ScalarType dtype) {
  if (t.defined() && t.is_floating_point() && t.scalar_type() != dtype) t = t.to(dtype);
  return true;
}
inline bool fsdp_cast_output(std::vector<at::Tensor>& v, at::ScalarType dtype) {
  for (at::Tensor& t : v) fsdp_cast_output(t, dtype);
  return true;
}
template <typename... T>
bool fsdp_cast_output(std::tuple<T...>& t, at::ScalarType dtype) {
  return std::apply([&](auto&... x) { return (fsdp_cast_output(x, dtype) && ... && true); }, t);
}
template <typename T>
bool fsdp_cast_output(T&, at::ScalarType) {
  return std::is_arithmetic_v<T>;  // nothing to cast; any other type: not reachable
}
}  // namespace detail
}  // namespace ddp
