// Join: training with uneven inputs, where ranks run out of data at
// different iterations (torch.distributed.algorithms.Join with DDP as the
// Joinable; `with model.join(): ...` in PyTorch).
//
//   ddp::join(model, [&] {
//     for (auto& batch : my_batches) {          // any number per rank
//       opt.zero_grad();
//       loss_fn(model(batch.x), batch.y).backward();
//       opt.step();
//     }
//   });
//
// Every rank runs `loop`. Each synchronised forward first all-reduces how
// many ranks are still training. A rank whose loop has returned "shadows"
// the collectives of the ranks still training: it answers that count with
// 0, takes part in the bucket rebuild and buffer broadcast, and all-reduces
// zero gradients in every bucket (with its used-parameter flags at 0), until
// every rank has finished. Finally every rank receives the parameters and
// buffers of the last rank to finish (the highest-numbered one when several
// finish together), so all replicas end identical.
//
// Semantics, as PyTorch:
//   - divide_by_initial_world_size (default): gradients are the sum over the
//     ranks still training divided by the initial world size, as if the
//     finished ranks contributed zeros; false divides by the number of ranks
//     still training (their plain average).
//   - throw_on_early_termination: as soon as one rank runs out, every rank
//     throws (InvalidArgument), so the caller can stop or re-balance.
//   - with join enabled, buffers are broadcast from the highest rank still
//     training (rank 0 may have finished).
//   - a finished rank's .grad() holds, after each shadowed iteration, the
//     averaged gradients the ranks still training got (for a parameter
//     none of them produced: what zero_grad() leaves); PyTorch's discards
//     them. A JoinHook
//     (ZeroRedundancyOptimizer) steps with them.
// Only DistributedDataParallel's own collectives are shadowed: collectives
// the loop issues itself (metrics, checkpoints) must be issued the same
// number of times on every rank, or moved after the join.
// Throws whatever the loop throws (on that rank only), and the errors of the
// collectives (TimeoutError, CommError).
#pragma once

#include <functional>
#include <vector>

#include "ddp/distributed_data_parallel.h"

namespace ddp {

struct JoinOptions {
  // false: run the loop and nothing else (uneven inputs then hang or time
  // out, as without join).
  bool enable = true;
  bool throw_on_early_termination = false;
  bool divide_by_initial_world_size = true;
};

// Another participant of a join (PyTorch's Joinable besides DDP): something
// whose collectives, issued once per iteration by the ranks still training,
// a finished rank must shadow. ZeroRedundancyOptimizer is one: its step()
// broadcasts every rank's shard.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // On a finished rank, once per synchronised iteration of the ranks still
  // training, after DistributedDataParallel's shadow of that iteration's
  // forward and backward (the rank's .grad() then holds the iteration's
  // averaged gradients, as the training ranks' do). It must issue the
  // collectives that each training rank issues once per such iteration
  // (for an optimizer: one step() per synchronised backward).
  virtual void main_hook() = 0;
};

namespace detail {
void join(DdpCore& core, const std::function<void()>& loop, const JoinOptions& options,
          const std::vector<JoinHook*>& hooks = {});
}

template <typename ModuleType>
void join(DistributedDataParallel<ModuleType>& model, const std::function<void()>& loop,
          const JoinOptions& options = {}) {
  detail::join(model.core(), loop, options);
}

// As above, with other participants shadowed after the model, in order:
//   ddp::join(model, {&zero_optimizer}, [&] { ... opt.step(); ... });
template <typename ModuleType>
void join(DistributedDataParallel<ModuleType>& model, const std::vector<JoinHook*>& hooks,
          const std::function<void()>& loop, const JoinOptions& options = {}) {
  detail::join(model.core(), loop, options, hooks);
}

}  // namespace ddp
