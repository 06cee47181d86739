// Internal: the Reducer's nested types, shared by its implementation files.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compat/autograd_compat.h"
#include "reducer/reducer.h"

namespace ddp::detail {

struct Reducer::Param {
  std::string name;   // full name, e.g. "head.aux.weight"
  at::Tensor tensor;  // the parameter (a leaf requiring grad)
  compat::NodePtr grad_accumulator;
  uintptr_t hook_key = 0;
  size_t bucket = 0;  // index into buckets_
  size_t slot = 0;    // position within the bucket
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
  // Zeroed at each iteration's start; reallocated only with the bucket (the
  // rebuild, register_comm_hook), after the last backward's host wait, so
  // no device copy from it is still queued then.
  at::Tensor produced;
  float* produced_data() const { return produced.data_ptr<float>(); }
  at::Tensor scale;               // 1 / divisor, in the bucket's dtype
  bool in_shared_memory = false;  // flat lives in shared memory (BucketBuffer)
};

// What one synchronised iteration writes (Note [Reducer protocol]): a new
// one at step 1, so nothing of the previous iteration survives by accident.
struct Reducer::Iteration {
  Iteration(size_t params, const std::vector<Bucket>& buckets)
      : ready(params, 0), saved_grads(params), hooks_seen(params, 0) {
    for (const Bucket& b : buckets) pending.push_back(b.params.size());
  }
  std::vector<char> ready;         // per parameter: marked ready
  std::vector<size_t> pending;     // per bucket: parameters not ready yet
  // Per parameter, gradient_as_bucket_view: .grad() saved before an unused
  // parameter's view is all-reduced, restored if no rank used it.
  std::vector<at::Tensor> saved_grads;
  // Marked ready at the first hook: unreachable from the outputs
  // (find_unused_parameters) or unused in the learned graph (static_graph).
  std::vector<size_t> unreachable;
  size_t next_launch = 0;          // next bucket to launch
  bool finalize_queued = false;
  // static_graph: gradient hooks seen per parameter, and the changes from
  // the learned graph found so far (Note [Static graph]).
  std::vector<int> hooks_seen;
  std::vector<std::string> static_changes;
};

// Note [Static graph]: what the first synchronised backward learned.
struct Reducer::StaticGraph {
  bool learned = false;
  std::vector<int> hooks_expected;     // per parameter
  std::vector<uint64_t> last_fired;    // learning: when each hook last fired
  uint64_t fire_clock = 0;
};


}  // namespace ddp::detail
