// Internal: the seam where a full gradient bucket becomes communication.
//
// Note [Bucket communication]
// The reducer (reducer.h) fills buckets and decides when each is ready; a
// BucketComm moves them between ranks. Per synchronised backward the
// reducer calls launch() once per bucket, in bucket order on every rank,
// then wait() once; after wait() every bucket's `grads` holds the averaged
// gradients and its `flags` the number of ranks that produced each
// parameter. A finished rank under join does the same with zero buckets.
// Two implementations:
//   FusedAllReduce (the default): gradients are copied in pre-divided; one
//     all_reduce per bucket over grads and flags together (one buffer), in
//     the group's shared memory in place when the bucket lives there.
//   HookComm: a user's CommHook per bucket on the undivided gradients, and
//     one all_reduce of every bucket's flags after the last hook
//     (comm_hooks.h). Buckets stay out of shared memory.
// An intra-host algorithm or a compression scheme is a new BucketComm (or a
// CommHook), not an edit of the reducer.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// What the seam sees of one bucket (tensors are views into the reducer's).
struct BucketIo {
  size_t index = 0, count = 0;  // this bucket, and the number of buckets
  at::Tensor flat;              // [grads | flags], one buffer
  at::Tensor grads, flags;
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets;
  int64_t iteration = 0;
  int divisor = 1;  // the average's denominator (world size, or join's)
};

class BucketComm {
 public:
  virtual ~BucketComm() = default;
  // Whether the reducer copies gradients in already divided by the divisor
  // (and may skip communication entirely alone in the group).
  virtual bool prescaled() const = 0;
  // Whether buckets may live in the group's shared memory.
  virtual bool shared_memory_buckets() const = 0;
  // "built-in all_reduce (fused with the used flags)", or the hook's name.
  virtual std::string name() const = 0;
  // Starts moving one bucket. Buckets arrive in index order, each once per
  // backward; launch() of index 0 starts a new backward.
  virtual void launch(const BucketIo& bucket) = 0;
  // Blocks until every launched bucket is done (see the note). Rethrows
  // collective errors; InvalidArgument for a hook's bad value.
  virtual void wait(const std::vector<BucketIo>& buckets) = 0;
};

struct BucketCommContext {
  ProcessGroupPtr group;
  std::optional<std::chrono::milliseconds> timeout;
};

std::unique_ptr<BucketComm> make_fused_all_reduce(BucketCommContext context);
std::unique_ptr<BucketComm> make_hook_comm(BucketCommContext context, CommHook hook,
                                           std::string name);

}  // namespace ddp::detail
