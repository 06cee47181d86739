// AutocastGuard: Python's `with torch.autocast(device_type, dtype):` as a C++
// scope. Inside it, the ops that autocast covers run in a lower precision on
// that device (matrix products and convolutions in bfloat16 or float16;
// softmax, losses and norms kept in float32; PyTorch's own per-op lists),
// exactly as in Python: the guard sets the same thread-local state of ATen.
//
//   {
//     ddp::AutocastGuard autocast(c10::kCPU, at::kBFloat16);
//     at::Tensor logits = model(x);                     // bfloat16 where autocast says
//     loss = at::cross_entropy_loss(logits, y);         // float32
//   }
//   scaler.scale(loss).backward();  // OUTSIDE the scope, as in Python
//
// The rule for backward (PyTorch's): leave the scope before backward(); the
// backward ops run in the dtypes their forward ops chose. Nesting works as in
// Python: an inner guard (another dtype, or enabled = false for a region that
// must stay in float32) restores the outer settings when it ends; the cast
// cache (weights cast once per outermost scope) is cleared when the outermost
// scope of the thread ends.
//
// Thread safety: autocast state is per thread (ATen's thread-local state), so
// a guard covers the thread that constructed it only; construct and destroy
// it on the same thread. Not copyable or movable.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace ddp {

struct AutocastOptions {
  // The autocast dtype: bfloat16 or float16. nullopt: the device's current
  // autocast dtype (bfloat16 on CPU, float16 on CUDA unless changed), as
  // Python's dtype=None.
  std::optional<at::ScalarType> dtype;
  // false: a region that runs in full precision inside an enclosing scope.
  bool enabled = true;
  // Keep the casts of weights (leaf tensors requiring grad) for the scope.
  // nullopt: the thread's current setting (on by default), as Python's None.
  std::optional<bool> cache_enabled;
};

class AutocastGuard {
 public:
  // device_type: c10::kCPU or c10::kCUDA. Throws InvalidArgument for another
  // device type, or a dtype other than bfloat16 and float16 (Python warns
  // and disables autocast; here it is refused, naming the dtype). With
  // kCUDA on a machine
  // without CUDA the guard logs a warning and leaves autocast off, as
  // Python does.
  explicit AutocastGuard(c10::DeviceType device_type, AutocastOptions options = {});
  AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

// Whether autocast is on for `device_type` on the calling thread, and its
// dtype (Python's torch.is_autocast_enabled / torch.get_autocast_dtype).
bool is_autocast_enabled(c10::DeviceType device_type);
at::ScalarType get_autocast_dtype(c10::DeviceType device_type);

}  // namespace ddp
