// Internal: which library call the calling thread's collectives belong to.
//
// Note [Call labels]
// A collective that stalls or times out is named by its operation and
// sequence number ("all_gather #94 on rank 0 of 2"), which tells a user
// little when the library issued it on their behalf: save_checkpoint,
// load_latest_checkpoint, the metrics' reductions, ZeroRedundancyOptimizer's
// consolidation, DistributedDataParallel's construction and its gradient
// buckets. Those calls open a CallScope (DDP's buckets a BucketScope,
// work.h); start_work labels each collective with the innermost one, the
// stall inspector publishes the label with the rank's progress, and so a
// stall report or a timeout reads "timed out after 5.0 s in save_checkpoint:
// rank 1 has not reached it: ... last started all_reduce #93 ... in DDP
// backward (step 12, bucket 0)", and ends with the call's advice
// ("save_checkpoint is collective: every rank calls it ...").
#pragma once

namespace ddp::detail {

// Labels the collectives the calling thread starts while the scope lives.
// `name` and `advice` must outlive the scope (string literals); `advice`
// (may be null: the enclosing scope's stays) ends a timeout's message.
// Scopes nest; the innermost name wins.
class CallScope {
 public:
  explicit CallScope(const char* name, const char* advice = nullptr);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  const char* previous_name_;
  const char* previous_advice_;
};

// The innermost scope's name and advice on this thread; null when none.
const char* current_call();
const char* current_call_advice();

// The advice of the checkpoint calls, which Python users are used to
// making on rank 0 alone.
inline constexpr const char* kCollectiveCheckpointAdvice =
    "Checkpoint saving and loading is collective: every rank of the group calls "
    "save_checkpoint (rank 0 writes the file) and load_latest_checkpoint; calling it on rank "
    "0 alone, as one saves in Python, leaves the other ranks waiting";

}  // namespace ddp::detail
