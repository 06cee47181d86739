// Communication hooks: how DistributedDataParallel turns a full gradient
// bucket into averaged gradients, replaceable by the user (PyTorch's
// DistributedDataParallel.register_comm_hook and
// torch.distributed.algorithms.ddp_comm_hooks).
//
//   ddp::DistributedDataParallel<Net> model(net);
//   model.register_comm_hook(ddp::fp16_compress_hook, "fp16_compress");
//   // ... train as usual: each bucket is all-reduced in float16.
//
// Without a hook the reducer all-reduces each bucket in place, with the
// parameters' "used" flags in the same buffer (one collective per bucket).
// With a hook, per synchronised backward and in bucket order on every rank:
//   1. when a bucket's last gradient is ready (the moment the built-in
//      all_reduce would start, so communication still overlaps backward),
//      the hook is called with a GradBucket whose buffer holds this rank's
//      gradients, NOT divided by the world size (the hook divides, as in
//      PyTorch);
//   2. after the last bucket's hook, the reducer all-reduces the used flags
//      of every parameter in one small collective of its own (float32, one
//      element per parameter), so unused parameters are still found and
//      named on every rank (with or without find_unused_parameters);
//   3. at the end of backward the reducer waits for each hook's BucketWork
//      and copies its value (the bucket's averaged gradients, the buffer's
//      shape and dtype) into .grad() (into the bucket, with
//      gradient_as_bucket_view).
// Hooks also run for a rank that has finished under ddp::join (on zero
// buffers, as in PyTorch), so they must issue the same collectives on every
// rank whatever the buffer holds. no_sync micro-steps call no hook (they do
// not communicate). At world size 1 the hook is still called (its rounding,
// e.g. fp16's, applies as in PyTorch).
// Buckets are not placed in the group's shared memory while a hook is
// registered: the hook's own collectives (all_reduce_async and friends)
// still take the shared-memory path for CPU tensors on one host.
//
// Errors: a hook or continuation that throws, or a value of the wrong size
// or dtype, makes backward() throw InvalidArgument naming the hook and the
// bucket; TimeoutError, CommError and MismatchError from its collectives
// keep their type. The ranks are then out of step: the wrapper refuses the
// next forward's backward (restart, or resume from a checkpoint).
//
// Threading: a hook runs on the thread that runs backward() (CPU) or on
// autograd's device threads (CUDA), under the reducer's lock: it must not
// call back into the wrapper. Its BucketWork is waited on at the end of
// backward, possibly on another autograd thread, after the GradBucket it
// was given is gone: continuations must copy (capture by value) what they
// need, as the built-in hooks do.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ddp/collectives.h"

namespace ddp {

// One bucket of gradients handed to a hook (PyTorch's dist.GradBucket).
struct GradBucket {
  // Position in the reducer's bucket order: 0 is the first bucket to become
  // ready (the last layers'); every rank calls hooks in this order.
  size_t index = 0;
  bool is_last = false;  // the last bucket of this backward
  // 1-D, contiguous, the parameters' dtype and device: this rank's
  // gradients of `parameters`, concatenated, not divided by anything. A
  // hook may modify it in place (the built-in hooks do) or return a fresh
  // tensor. For a parameter that got no gradient on this rank: its .grad()
  // if defined (e.g. from earlier accumulation), else zero.
  at::Tensor buffer;
  // The bucket's parameters and the element offset of each one's gradient
  // in `buffer` (gradients() gives the shaped views).
  std::vector<at::Tensor> parameters;
  std::vector<int64_t> offsets;
  // What the built-in hooks divide the sum by: the group size (PyTorch's
  // process_group.size()); under ddp::join with divide_by_initial_world_size
  // = false, the number of ranks still training (PyTorch's hooks always
  // divide by the group size).
  int divisor = 1;
  // The wrapper's process group and timeout: pass to the collectives.
  CollectiveOptions collective;
  // Synchronised backward passes completed before this one (0 first).
  int64_t iteration = 0;

  // Views of `buffer` shaped like each parameter.
  std::vector<at::Tensor> gradients() const;
};

// A hook's asynchronous result, PyTorch's torch.futures.Future[Tensor] for
// one bucket: wait() blocks until it is available and returns it. Copies
// share the one result. Not thread-safe: one thread waits. An error is
// kept: every later wait() rethrows it without running anything again.
class BucketWork {
 public:
  BucketWork() = default;
  // Done when `work` is; its value is then `value` (usually the tensor the
  // collective reduced in place).
  BucketWork(Work work, at::Tensor value);
  // Already done.
  static BucketWork ready(at::Tensor value);
  // Future.then: a BucketWork whose value is fn(this one's value), computed
  // in wait() (e.g. decompression). Consumes this handle's chain.
  BucketWork then(std::function<at::Tensor(at::Tensor)> fn) &&;
  // Blocks until done and returns the value; rethrows the collective's or
  // the continuation's error. Calling it again returns the same value.
  at::Tensor wait();
  bool valid() const { return state_ != nullptr; }

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// A communication hook. Called once per bucket per synchronised backward;
// must issue the same collectives, in the same order, on every rank.
// Capture any state (PyTorch's `state` argument) in the callable, or use
// DistributedDataParallel::register_comm_hook(state, hook).
using CommHook = std::function<BucketWork(GradBucket& bucket)>;

// ---- Built-in hooks (torch.distributed.algorithms.ddp_comm_hooks) ----

// default_hooks.allreduce_hook: buffer /= divisor, all_reduce SUM. Gives
// the same values as no hook (which also fuses the used flags into the
// bucket and may reduce it in shared memory in place).
BucketWork allreduce_hook(GradBucket& bucket);

// default_hooks.fp16_compress_hook: the buffer is cast to float16, divided
// by the divisor and all-reduced (half the bytes on the wire); the sum is
// cast back into the buffer. Gradients are rounded to float16 (about 3
// significant digits; values beyond ±65504 overflow to inf).
BucketWork fp16_compress_hook(GradBucket& bucket);

// default_hooks.bf16_compress_hook: as fp16_compress_hook with bfloat16
// (float32's range, about 2 significant digits). Where the backend has no
// bfloat16 all_reduce (Gloo before PyTorch 2.0) all_reduce widens it to
// float32 on the wire (collectives.h), so the values are bfloat16-rounded
// but the bytes are not halved.
BucketWork bf16_compress_hook(GradBucket& bucket);

// default_hooks.fp16_compress_wrapper / bf16_compress_wrapper: a hook that
// casts the buffer to float16 (bfloat16), runs `hook` on it, and casts its
// value back into the original buffer. `hook` does the dividing.
CommHook fp16_compress_wrapper(CommHook hook);
CommHook bf16_compress_wrapper(CommHook hook);

}  // namespace ddp
