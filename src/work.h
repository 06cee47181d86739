// Internal: the state of a started operation (the pair of ddp::Work,
// collectives.h), how operations start, and how their errors are translated
// (docs/errors.md).
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
  std::chrono::milliseconds timeout{0};
  std::function<void()> then;  // runs once after success (e.g. AVG's divide)
  uint64_t flight_id = 0;      // the flight recorder's entry (when it has one)
  bool stall_noted = false;    // a stall was noted in the flight record; guarded by mu

  std::mutex mu;
  bool finished = false;          // guarded by mu
  std::atomic<bool> done{false};  // finished, readable without mu
  std::exception_ptr error;

  void wait();
  // Marks the flight record's entry ended and notes `reason` (when not
  // null) as an event of the group's recorder.
  void record_end(flight::State state, const char* reason);

 private:
  void wait_with_stall_reports();
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

// The group `options` names, or the default group.
ProcessGroup& resolve_group(const CollectiveOptions& options);

// Rethrows the current exception (inside a catch block) as TimeoutError or
// CommError with `what` prepended. ddp::Error passes through unchanged.
[[noreturn]] void rethrow_as_comm_error(const std::string& what);

}  // namespace ddp::detail
