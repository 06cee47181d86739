// Internal: the reducer wing's door. Everything the reducer (reducer.h)
// needs from the ranks' communication passes through this interface; the
// wing includes nothing of a process group's internals (no
// process_group_impl.h, no work.h). Its implementations over a ddp
// ProcessGroup live outside the wing (group_bucket_comm.h).
//
// Note [Bucket communication]
// The reducer fills buckets and decides when each is ready; a BucketComm
// gives the buckets their memory and moves them between ranks. Per
// synchronised backward the reducer calls launch() once per bucket, in
// bucket order on every rank, then wait() once, then fence(); after wait()
// every bucket's `grads` holds the averaged gradients and its `flags` the
// number of ranks that produced each parameter. A finished rank under join
// does the same with zero buckets. Two implementations today:
//   FusedAllReduce (the default): gradients are copied in pre-divided; one
//     all_reduce per bucket over grads and flags together (one buffer), in
//     the group's shared memory in place when allocate() put the bucket
//     there (fence() then waits for the peers' reads).
//   HookComm: a user's CommHook per bucket on the undivided gradients, and
//     one all_reduce of every bucket's flags after the last hook
//     (comm_hooks.h). Buckets live in ordinary memory.
// An intra-host algorithm, a compression scheme or a sharded reduction is a
// new BucketComm (or a CommHook), not an edit of the reducer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

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

// A bucket's flat buffer, zeroed, and where it lives.
struct BucketBuffer {
  at::Tensor tensor;
  // In memory the local peers read in place (the group's shared segment);
  // fence() before writing into it again.
  bool in_shared_memory = false;
};

class BucketComm {
 public:
  virtual ~BucketComm() = default;
  // Whether the reducer copies gradients in already divided by the divisor
  // (and may skip communication entirely alone in the group).
  virtual bool prescaled() const = 0;
  // "built-in all_reduce (fused with the used flags)", or the hook's name.
  virtual std::string name() const = 0;
  // A zeroed 1-d buffer of `numel` elements with `options` (dtype, device)
  // for one bucket: in shared memory where this comm reduces it there,
  // else ordinary memory. Thread-safe.
  virtual BucketBuffer allocate(int64_t numel, const at::TensorOptions& options) = 0;
  // Starts moving one bucket. Buckets arrive in index order, each once per
  // backward; launch() of index 0 starts a new backward.
  virtual void launch(const BucketIo& bucket) = 0;
  // Blocks until every launched bucket is done (see the note). Rethrows
  // collective errors; InvalidArgument for a hook's bad value.
  virtual void wait(const std::vector<BucketIo>& buckets) = 0;
  // After wait(), before the buckets are written again, when some bucket
  // is in shared memory: blocks until the local peers have finished reading
  // this rank's shared buffers. Throws TimeoutError / CommError.
  virtual void fence() = 0;
};

}  // namespace ddp::detail
