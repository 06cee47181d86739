// Internal: the reducer averages gradients across ranks during backward().
//
// Note [Reducer protocol]
// Every rank owns the same buckets (same parameters, same order). Per
// synchronised iteration:
//   1. prepare_for_backward() (end of forward) resets the per-iteration
//      state and, with find_unused_parameters, finds the parameters the
//      outputs cannot reach.
//   2. A post-hook on each parameter's gradient accumulator fires when its
//      gradient is accumulated into .grad(): the gradient is copied into its
//      bucket, pre-multiplied by 1/world_size (as PyTorch does: the sum of
//      the scaled values cannot overflow where the plain sum might), and its
//      "produced" flag is set. The first hook queues finalize_backward() on
//      the autograd engine and marks the unreachable parameters ready.
//   3. A bucket whose parameters are all ready is all-reduced asynchronously,
//      strictly in bucket order on every rank (Gloo and NCCL match
//      collectives by order).
//   4. finalize_backward() runs when the engine has finished the graph:
//      parameters that got no gradient are marked ready now (contributing
//      their .grad() if defined, zero otherwise), so every rank issues every
//      bucket's all_reduce and no rank can hang on another's missing bucket.
//      It waits for all buckets and writes the averages back to .grad().
// Micro-steps under no_sync() (a forward while gradient sync is off) only
// accumulate into .grad(); the reducer records which parameters got a
// gradient in them (used_since_sync_). At the next synchronised backward
// such a parameter counts as produced by this rank even if the last
// micro-step did not use it: its accumulated .grad() is its contribution,
// so every rank ends with the average (as PyTorch's local_used_map).
// Two synchronised forwards before one backward: with
// find_unused_parameters the parameters reachable from either forward's
// outputs are expected (the sets are joined), so a backward through both
// is reduced correctly.
// Every backward must come from a forward of the wrapper: a gradient that
// arrives when no forward of ours is waiting for its backward is either a
// second backward of one forward (an output of that forward saw a gradient
// again: hooks on the outputs tell) or a graph built without the wrapper
// (module()->forward()), and raises naming which.
// Moving a full bucket between ranks is the BucketComm's job (Note [Bucket
// communication] in bucket_comm.h): by default one all_reduce per bucket,
// or a user's comm hook.
// Each bucket's flat buffer carries, after the gradients, one slot per
// parameter holding 1 where this rank produced the gradient. After the
// all_reduce the slot counts the ranks that did: 0 means unused everywhere
// (.grad() is left untouched, as in PyTorch); fewer than world_size without
// find_unused_parameters is an error that every rank detects identically,
// without any extra collective.
//
// Note [Static graph]
// With static_graph the first synchronised backward learns the graph: how
// many times each parameter's gradient hook fires (0: unused on this rank;
// more than 1: a re-entrant backward, e.g. activation checkpointing of a
// module used twice, accumulates into .grad() more than once). Nothing is
// launched during that backward; finalize_backward() reduces every bucket
// (as PyTorch's delay_all_reduce) and records the counts and the order for
// the bucket rebuild. From then on no graph is searched: the parameters
// unused in the first iteration are marked ready at the first hook, and a
// parameter becomes ready at its last expected hook, so its gradient is
// reduced once, after its last use. A backward whose counts differ (the
// graph changed) still reduces every bucket, then raises InvalidArgument on
// the rank that saw the change, naming the parameter and both counts.
//
// Threading: the hooks and the callback run on the thread running
// backward() (CPU) or autograd's device threads (CUDA); all state is guarded
// by mu_.
//
// Note [CUDA buckets]
// For a module on a GPU the buckets live on its device and every step is
// queued on a stream, never waited for by the host during backward:
//   - a hook copies (and pre-scales) its gradient into the bucket on the
//     calling thread's current stream, which autograd has set to the stream
//     that produced the gradient; the flags travel from a pinned host
//     buffer without a wait (non_blocking copy; the buffer is not written
//     again before the iteration's host wait below);
//   - a full bucket's all_reduce starts at once: c10d makes its NCCL stream
//     wait for the current stream, so it reads the finished copies;
//   - at the end of backward (the engine's callback, on the thread that
//     called backward(), after autograd has synchronised the leaf streams
//     with its current stream) every bucket's work is waited for on the
//     stream first (Note [Device waits] in work.h), then once on the host,
//     bounded by the timeout: the used flags decide on the host which
//     .grad() to write and which error to raise, at this backward, as on
//     CPU. The copies into .grad() are then queued on the current stream,
//     before any optimizer kernel the caller queues after backward().
// That one host wait per iteration (PyTorch's reducer makes it only with
// find_unused_parameters) is the price of naming an unused parameter at
// the very backward that missed it, and of a NCCL timeout that names the
// ranks. Timings use CUDA events (Note [Device timing], device_clock.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bucket_comm.h"
#include "ddp/collectives.h"
#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"

namespace ddp::detail {

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25 << 20;
  int64_t first_bucket_cap_bytes = 1 << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;  // Note [Static graph]
  // Reduce through the backend even at world size 1 (DDP_REDUCE_AT_WORLD_SIZE_1).
  bool reduce_alone = false;
  std::optional<std::chrono::milliseconds> timeout;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // params: the parameters to reduce (requires_grad, deduplicated, all on
  // one device), names their full names for messages.
  static std::shared_ptr<Reducer> create(std::vector<std::string> names,
                                         std::vector<at::Tensor> params,
                                         ProcessGroupPtr group,
                                         ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // At a synchronised forward: rebuilds the buckets once, after the first
  // iteration, in the order rank 0's gradients became ready (a broadcast).
  void prepare_for_forward();
  // At the end of a synchronised forward. outputs: the forward's tensors
  // (used with find_unused_parameters; outputs_known false if they could not
  // be listed, which is then an error).
  void prepare_for_backward(const std::vector<at::Tensor>& outputs,
                            bool outputs_known);
  // At the end of a forward under no_sync() with gradients enabled: its
  // backward accumulates locally. (A forward without grad mode builds no
  // graph and is not reported.)
  void forward_without_sync();
  // NoSyncGuard: whether gradient sync is requested now (false inside the
  // guard). Debug mode checks it when a no_sync forward's backward runs.
  void set_sync_requested(bool requested);

  // What the reducer knows of the public DdpStats (DdpCore adds the
  // forward's times): its own struct, so that the reducer depends on no
  // public DDP header.
  struct Stats {
    int64_t iterations = 0;
    int world_size = 1;
    std::vector<int64_t> bucket_bytes, bucket_params;
    int64_t parameters = 0, gradient_bytes = 0, shared_memory_buckets = 0;
    int64_t unused_parameters_last = 0;
    bool buckets_rebuilt = false;
    double backward_compute_s = 0, backward_comm_s = 0, exposed_comm_s = 0;  // per iteration
    std::string comm_hook;
  };
  Stats stats() const;

  // Replaces the built-in all_reduce with `hook` (comm_hooks.h). Only before
  // the first forward, once: InvalidArgument otherwise. Re-lays the buckets
  // out of shared memory.
  void register_comm_hook(CommHook hook, std::string name);

  // Join (see join.h): for the next synchronised iteration, `users` ranks
  // produce gradients and the sum is divided by `divisor`. Default: the
  // world size for both.
  void set_iteration_users(int users, int divisor);
  // A finished rank's part of one iteration of the ranks still training:
  // all-reduces zeros (gradients and used flags) in every bucket, in order,
  // and writes the result (the others' averaged gradients) into .grad() of
  // every parameter some rank produced; the others' .grad() is cleared as
  // the default zero_grad() would.
  void shadow_backward();

 private:
  struct Param;
  struct Bucket;
  struct Timing;

  Reducer(std::vector<std::string> names, std::vector<at::Tensor> params,
          ProcessGroupPtr group, ReducerOptions options);
  void install_hooks();
  void build_buckets(const std::vector<size_t>& order);
  at::Tensor allocate_flat(int64_t numel, const at::TensorOptions& opts);
  // Before gradients are written into buckets in shared memory again, the
  // peers must be done reading them (ShmGroup::fence).
  void fence_shared_buckets();

  void autograd_hook(size_t index);
  // A gradient arrived with no synchronised backward expected: local
  // accumulation (no_sync), or one of the errors of Note [Reducer protocol].
  void unexpected_gradient(size_t index);
  void hook_outputs(const std::vector<at::Tensor>& outputs);
  void output_grad_seen();
  void mark_ready(size_t index, bool produced);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void start_comm(size_t bucket);
  std::vector<BucketIo> bucket_io() const;
  BucketIo bucket_io(size_t bucket) const;
  void finalize_backward();
  // Queues finalize_backward() on the running graph task, once per backward.
  void queue_finalize();
  // Waits for every bucket and writes the results into .grad(); counts[i]:
  // how many ranks produced parameter i. shadow: a finished rank's (join),
  // whose parameters no rank produced are cleared as by zero_grad().
  void wait_and_write_back(std::vector<float>& counts, bool shadow = false);
  void check_unused(const std::vector<float>& counts);
  bool produced_here(size_t index) const;
  // World size 1 with the plain average (no join divisor): the all_reduce
  // and the 1/1 scale are identities, so buckets are skipped entirely and
  // .grad() is left as autograd wrote it (exactly the values the buckets
  // would give; gradient_as_bucket_view makes no views then).
  // A comm hook is called even then (its rounding applies, as in PyTorch).
  bool local_only() const {
    return world_size_ == 1 && divisor_ == 1 && comm_->prescaled() && !options_.reduce_alone;
  }
  std::vector<size_t> unreachable_from(const std::vector<at::Tensor>& outputs) const;
  void reset_iteration();
  // Note [Static graph] (reducer_static_graph.cc).
  bool static_learning() const { return options_.static_graph && !static_learned_; }
  bool static_graph_hook(size_t index);
  std::vector<size_t> static_unused() const;
  void learn_static_graph();
  void check_static_graph(bool learned_now);

  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  ProcessGroupPtr group_;
  ReducerOptions options_;
  std::unique_ptr<BucketComm> comm_;
  bool custom_hook_ = false;
  int world_size_;
  int users_ = 0;          // ranks producing gradients this iteration
  int divisor_ = 0;        // the scale in every bucket is 1 / divisor_
  int next_users_ = 0, next_divisor_ = 0;  // set_iteration_users()

  mutable std::mutex mu_;
  // Per-iteration state (guarded by mu_).
  bool expect_hooks_ = false;      // prepared, backward not finished
  // The last forward with gradients: none yet, synchronised, or no_sync.
  enum class Mode { kNone, kSync, kLocal } mode_ = Mode::kNone;
  bool sync_requested_ = true;     // set_sync_requested()
  std::vector<char> used_since_sync_;  // per parameter: no_sync micro-steps
  // Gradients seen at the outputs of synchronised forwards (hook_outputs),
  // and their number when the last synchronised backward finished.
  uint64_t output_grads_ = 0, output_grads_at_finalize_ = 0;
  bool outputs_hooked_ = false;    // the last synchronised forward's outputs
  bool finalized_ = false;         // a backward finished since the forward
  bool first_hook_seen_ = false;
  bool finalize_queued_ = false;
  bool broken_ = false;            // waiting for the buckets threw
  size_t next_launch_ = 0;         // next bucket to all_reduce
  std::vector<char> ready_;        // per parameter
  std::vector<size_t> unreachable_;
  // Bucket rebuild (guarded by mu_).
  std::vector<size_t> ready_order_;  // first iteration's order
  bool rebuild_done_ = false;
  int64_t iterations_ = 0;
  int64_t unused_last_ = 0;
  bool ever_unused_ = false;
  bool warned_never_unused_ = false;
  bool shared_buckets_ = false;  // the last allocate_flat() gave shared memory
  std::unique_ptr<Timing> timing_;
  // static_graph: hooks seen per parameter this iteration, and expected
  // (learned in the first synchronised iteration).
  std::vector<int> hooks_seen_, hooks_expected_;
  std::vector<uint64_t> last_fired_;  // learning: when each hook last fired
  uint64_t fire_clock_ = 0;
  bool static_learned_ = false;
  std::vector<std::string> static_changes_;  // this iteration's violations
};

}  // namespace ddp::detail
