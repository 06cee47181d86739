// Internal: the Reducer's nested types, shared by its implementation files.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compat/autograd_compat.h"
#include "device_clock.h"
#include "ddp/collectives.h"
#include "reducer.h"

namespace ddp::detail {

struct Reducer::Param {
  std::string name;   // full name, e.g. "head.aux.weight"
  at::Tensor tensor;  // the parameter (a leaf requiring grad)
  compat::NodePtr grad_accumulator;
  uintptr_t hook_key = 0;
  size_t bucket = 0;  // index into buckets_
  size_t slot = 0;    // position within the bucket
  // gradient_as_bucket_view: .grad() saved before an unused parameter's view
  // is all-reduced, restored if no rank used it.
  at::Tensor saved_grad;
};

// Layout of flat: [gradients of params[0], params[1], ... | one flag per
// parameter]. grads/flags/views are views into flat.
struct Reducer::Bucket {
  std::vector<size_t> params;    // indices into params_, in bucket order
  std::vector<int64_t> offsets;  // element offset of each parameter
  int64_t grad_numel = 0;
  at::Tensor flat, grads, flags;
  std::vector<at::Tensor> views;  // shaped like each parameter
  // This iteration's flags (float, one per parameter), copied into `flags`
  // at launch: host memory, pinned for a device bucket (Note [CUDA buckets]).
  at::Tensor produced;
  float* produced_data() const { return produced.data_ptr<float>(); }
  at::Tensor scale;               // 1 / world_size, in the bucket's dtype
  size_t pending = 0;             // parameters not ready yet
  bool in_shared_memory = false;  // flat lives in the group's shared memory
};

struct Reducer::Timing {
  explicit Timing(c10::Device device) : clock(device) {}
  DeviceClock clock;  // Note [Device timing]
  bool rebuilt = false;
};

}  // namespace ddp::detail
