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
// Moving a full bucket between ranks, and where its memory lives, is the
// BucketComm's job (Note [Bucket communication] in bucket_comm.h, the
// wing's door): by default one all_reduce per bucket, or a user's comm
// hook. The reducer uses the process group only through the public
// collectives (rank, size, the rebuild's broadcast), never its internals.
// The steps above are the phases of Reducer::Phase; everything one
// iteration writes is one Reducer::Iteration, reset by assignment at step 1.
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
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/process_group.h"
#include "reducer/bucket_comm.h"
#include "reducer/device_clock.h"

namespace ddp::detail {

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25 << 20;
  int64_t first_bucket_cap_bytes = 1 << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;  // Note [Static graph]
  // Reduce through the backend even at world size 1 (DDP_REDUCE_AT_WORLD_SIZE_1).
  bool reduce_alone = false;
  // Debug mode (the group's, Note [Debug mode]): the usage checks that cost
  // time, such as a no_sync forward's backward after the guard ended.
  bool debug = false;
  // Bounds the rebuild's broadcast; default: the group's timeout.
  std::optional<std::chrono::milliseconds> timeout;
  // DDP's mixed precision (reduce_dtype): the buckets' dtype, when not the
  // parameters'. Gradients are cast into them and back into .grad().
  std::optional<c10::ScalarType> bucket_dtype;
  // Called once at the end of every backward that reaches the reducer's
  // hooks (synchronised: after the last gradient is in its bucket, before
  // .grad() is written; no_sync: when the autograd engine finishes), on the
  // thread finishing the backward, under the reducer's lock: it must not
  // call into the reducer. Mixed precision swaps the parameters back here.
  std::function<void()> on_backward_end;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // params: the parameters to reduce (requires_grad, deduplicated, all on
  // one device), names their full names for messages. group: for its rank
  // and size and the rebuild's broadcast (public collectives only). comm:
  // how buckets get their memory and move (make_fused_all_reduce in
  // group_bucket_comm.h, as DdpCore does).
  static std::shared_ptr<Reducer> create(std::vector<std::string> names,
                                         std::vector<at::Tensor> params,
                                         ProcessGroupPtr group,
                                         std::unique_ptr<BucketComm> comm,
                                         ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // After the parameters' gradient accumulators changed (a dtype swap,
  // Note [Mixed-precision parameters]): attaches the hooks to the current
  // ones. Hooks on the old ones stay, so a graph still holding one reports
  // as before.
  void refresh_hooks();
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

  // Replaces the built-in communication with `comm` (a user's comm hook:
  // make_hook_comm). Only before the first forward, once: InvalidArgument
  // otherwise. Re-lays the buckets out in the new comm's memory.
  void register_comm_hook(std::unique_ptr<BucketComm> comm);

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

  // The steps of Note [Reducer protocol] for the last synchronised forward.
  enum class Phase {
    kIdle,      // none pending: no forward with gradients yet, or a no_sync one
    kPrepared,  // step 1 done; no gradient has arrived yet
    kReducing,  // steps 2-3: gradients arriving, full buckets launched
    kFinished,  // step 4 done: averages written into .grad()
    kBroken,    // waiting for the buckets threw; the ranks are out of step (for good)
  };

 private:
  struct Param;
  struct Bucket;
  struct Iteration;
  struct StaticGraph;

  Reducer(std::vector<std::string> names, std::vector<at::Tensor> params,
          ProcessGroupPtr group, std::unique_ptr<BucketComm> comm, ReducerOptions options);
  // Hooks every parameter's current gradient accumulator (skipping those
  // already hooked). Caller holds mu_ or has not shared the reducer yet.
  void install_hooks();
  // A no_sync backward: on_backward_end once, when the engine finishes.
  void queue_local_end();
  void build_buckets(const std::vector<size_t>& order);
  // Before gradients are written into buckets in shared memory again, the
  // peers must be done reading them (BucketComm::fence).
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
  // Whether a synchronised backward expects gradients now.
  bool expecting() const { return phase_ == Phase::kPrepared || phase_ == Phase::kReducing; }
  // World size 1 with the plain average (no join divisor): the all_reduce
  // and the 1/1 scale are identities, so buckets are skipped entirely and
  // .grad() is left as autograd wrote it (exactly the values the buckets
  // would give; gradient_as_bucket_view makes no views then).
  // A comm hook is called even then (its rounding applies, as in PyTorch).
  bool local_only() const;
  std::vector<size_t> unreachable_from(const std::vector<at::Tensor>& outputs) const;
  // Step 1: a fresh Iteration, the join divisor of set_iteration_users().
  void reset_iteration();
  // Note [Static graph] (reducer_static_graph.cc).
  bool static_learning() const;
  bool static_graph_hook(size_t index);
  std::vector<size_t> static_unused() const;
  void learn_static_graph();
  void check_static_graph(bool learned_now);

  // Set at construction; the buckets and the comm change only at the
  // one-time rebuild (prepare_for_forward of the second iteration) and at
  // register_comm_hook (before the first forward), both under mu_.
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  ProcessGroupPtr group_;
  ReducerOptions options_;
  std::unique_ptr<BucketComm> comm_;
  bool custom_hook_ = false;
  int world_size_;

  mutable std::mutex mu_;  // guards everything below
  Phase phase_ = Phase::kIdle;
  // The last forward with gradients: none yet, synchronised, or no_sync.
  enum class Mode { kNone, kSync, kLocal } mode_ = Mode::kNone;
  bool sync_requested_ = true;  // set_sync_requested()
  bool local_end_queued_ = false;  // queue_local_end() pending
  std::unique_ptr<Iteration> iter_;
  // Join: ranks producing gradients this iteration and the divisor (the
  // scale in every bucket is 1 / divisor), and the next iteration's.
  struct Users {
    int users = 0, divisor = 0;
  } now_, next_;
  // Per parameter: got a gradient in a no_sync micro-step since the last
  // synchronised backward (its accumulated .grad() is its contribution).
  std::vector<char> used_since_sync_;
  // Gradients seen at the outputs of synchronised forwards (hook_outputs),
  // their number when the last synchronised backward finished, and whether
  // the last synchronised forward's outputs could be hooked.
  uint64_t output_grads_ = 0, output_grads_at_finalize_ = 0;
  bool outputs_hooked_ = false;
  // The one bucket rebuild: the first iteration's ready order, whether it
  // was decided, and whether the buckets were rebuilt.
  struct Rebuild {
    std::vector<size_t> order;
    bool done = false, rebuilt = false;
  } rebuild_;
  int64_t iterations_ = 0;
  // find_unused_parameters: unused in the last backward, ever unused, and
  // whether the never-unused warning was given.
  int64_t unused_last_ = 0;
  bool ever_unused_ = false, warned_never_unused_ = false;
  std::unique_ptr<StaticGraph> static_;  // with static_graph only
  std::unique_ptr<DeviceClock> clock_;   // Note [Device timing]
};

}  // namespace ddp::detail
