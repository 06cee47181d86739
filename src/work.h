// Internal: the state of a started operation (the pair of ddp::Work,
// collectives.h), how operations start, and how their errors are translated
// (docs/errors.md).
//
// Note [Device waits]
// A Gloo operation's c10d wait() blocks the host until it is done, with a
// timeout. A NCCL operation's, called without a timeout and with blocking
// wait off (PyTorch's default; with a timeout it would block the host),
// only makes the calling thread's current CUDA stream wait for the
// collective's stream and returns at once: a kernel of a rank that stopped
// would block the stream, never the host, and only NCCL's watchdog would
// notice. ddp splits the wait in two:
//   wait_stream()  c10d's wait: kernels queued next on the current stream
//                  (the AVG division, a comm hook's decompression, the
//                  reducer's copies into .grad()) run after the collective;
//                  the host does not wait. The reducer calls it for every
//                  bucket, so no bucket costs the host a wait.
//   wait()         the same, then the host polls the collective's completion
//                  (work->isCompleted(), which NCCL answers from its end
//                  event) in slices of the stall-warning threshold, up to
//                  the timeout: the stall reports and the TimeoutError name
//                  the ranks that have not arrived, as on Gloo. ddp::Work's
//                  wait() is this one, so "returns when the result is in
//                  the tensors" holds on every backend (PyTorch's returns
//                  earlier on NCCL).
// After a timeout or a failure the group is abandoned (ProcessGroupImpl::
// abandon): a NCCL group's communicators are aborted at once, which ends the
// kernels stuck in them, before NCCL's watchdog (set to the timeout plus a
// margin, compat::make_nccl) would tear the process down. (With
// TORCH_NCCL_BLOCKING_WAIT=1 c10d's own wait blocks the host, up to the
// watchdog's timeout, before ddp's polling starts.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "flight/flight_format.h"
#include "process_group_impl.h"

namespace ddp::detail {

// State of one started operation (see ddp::Work).
struct WorkImpl {
  ProcessGroupPtr group;                // kept alive while the work runs
  uint64_t seq = 0;                     // the group's sequence number
  c10::intrusive_ptr<c10d::Work> work;  // null: already complete
  std::string what;                     // describe() of the operation
  // Note [Call labels] (call_scope.h): " in save_checkpoint", " in DDP
  // backward (step 3, bucket 0)", or ""; and the call's advice, or null.
  std::string in_call;
  const char* advice = nullptr;
  std::chrono::milliseconds timeout{0};
  std::function<void()> then;  // runs once after success (e.g. AVG's divide)
  // `then` reads the result on the host (a staged CPU tensor, Note [Staging
  // on NCCL] in collectives.cc): it runs after completion, never after the
  // stream half alone, so that no copy blocks the host without a bound.
  bool then_on_host = false;
  uint64_t flight_id = 0;      // the flight recorder's entry (when it has one)
  bool stall_noted = false;    // a stall was noted in the flight record; guarded by mu

  // Numbered among the group's collectives, with the stall inspector,
  // debug-mode checks and a flight record; false for point-to-point
  // operations (Note [Point-to-point numbering] in point_to_point.cc).
  bool collective = true;

  // The operation runs on a device (CUDA tensors, NCCL): c10d's wait()
  // only makes the calling thread's current stream wait for it (Note
  // [Device waits]).
  bool on_device = false;

  std::mutex mu;
  bool finished = false;          // guarded by mu
  std::atomic<bool> done{false};  // finished, readable without mu
  bool stream_waited = false;     // guarded by mu
  std::exception_ptr error;

  // Waits until the operation has completed (ddp::Work::wait()).
  void wait();
  // Orders the operation before the work queued next on the calling
  // thread's current stream, without waiting on the host (the continuation
  // `then` is queued there too); for host operations (Gloo on CPU) the
  // same as wait(). A later wait() still waits for completion.
  void wait_stream();
  // Marks the flight record's entry ended and notes `reason` (when not
  // null) as an event of the group's recorder.
  void record_end(flight::State state, const char* reason);

 private:
  void wait_with_stall_reports();
  CollectiveMonitor* monitor_or_null() const;  // null for point-to-point
  // Bounded polling of a device operation's completion (Note [Device waits]).
  bool completed_within(std::chrono::steady_clock::duration slice);
  void finish_with_error();
  std::string with_stall_report(const std::string& message) const;
  std::exception_ptr with_last_words(const CommError& e) const;
};

// The DistributedDataParallel iteration and gradient bucket whose
// communication the calling thread starts while the scope lives
// (BucketComm::launch, a comm hook's collectives included): start_work
// records them in the flight record and hands the step to the stall
// inspector, so that the reducer never reaches into a group's internals.
class BucketScope {
 public:
  BucketScope(int64_t step, int bucket);
  ~BucketScope();
  BucketScope(const BucketScope&) = delete;
  BucketScope& operator=(const BucketScope&) = delete;

 private:
  int64_t previous_step_;
  int previous_bucket_;
};

// Starts a c10d operation: resolves the group and timeout from `options`,
// numbers the operation, records it for the stall inspector and the flight
// recorder (with `fingerprint()` as its signature), in debug mode
// checks `fingerprint()` (operation, shapes, dtypes) against the other ranks
// (Note [Debug mode]), runs `start(backend, timeout)` and wraps the result.
// `start`'s exceptions are translated like wait()'s.
std::shared_ptr<WorkImpl> start_work(
    const CollectiveOptions& options, const std::string& op,
    const std::function<c10::intrusive_ptr<c10d::Work>(
        compat::Backend&, std::chrono::milliseconds)>& start,
    const std::function<std::string()>& fingerprint = nullptr);

// Starts a send or receive (point_to_point.h): as start_work, but numbered
// apart from the collectives (Note [Point-to-point numbering]), without the
// stall inspector, debug checks or flight record, bounded by its timeout.
std::shared_ptr<WorkImpl> start_point_to_point(
    const CollectiveOptions& options, const std::string& op,
    const std::function<c10::intrusive_ptr<c10d::Work>(
        compat::Backend&, std::chrono::milliseconds)>& start);

// The group `options` names, or the default group.
ProcessGroup& resolve_group(const CollectiveOptions& options);

// Rethrows the current exception (inside a catch block) as TimeoutError or
// CommError with `what` prepended. ddp::Error passes through unchanged.
[[noreturn]] void rethrow_as_comm_error(const std::string& what);

}  // namespace ddp::detail
