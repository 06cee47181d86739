// Internal: what a ddp::ProcessGroup holds, and the helpers the collectives
// and the reducer share to start c10d operations and translate their errors.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "collective_monitor.h"
#include "compat/torch_compat.h"
#include "flight/flight_recorder.h"
#include "shm/shm_group.h"
#include "tensor_text.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "ddp/process_group.h"

namespace ddp::detail {

struct ProcessGroupImpl {
  int rank = 0;
  int size = 1;
  std::string backend_name;
  std::string address;  // rendezvous address, for messages
  std::chrono::milliseconds timeout{kDefaultTimeout};
  c10::intrusive_ptr<c10d::Store> store;  // the group's (prefixed) store
  c10::intrusive_ptr<compat::Backend> backend;
  // Number of collectives started on this group; each gets the next one.
  std::atomic<uint64_t> next_seq{0};
  // Stall inspector and debug-mode check (null for a group of one).
  std::unique_ptr<CollectiveMonitor> monitor;
  // Flight recorder (ddp/flight_recorder.h; null when turned off).
  std::unique_ptr<flight::FlightRecorder> flight;
  // DistributedDataParallel's iteration of the last bucket started; -1: none.
  std::atomic<int64_t> step{-1};
  // Intra-host shared-memory all_reduce (null: Gloo alone), and why not.
  std::unique_ptr<shm::ShmGroup> shm;
  std::string shm_off_reason;
  // Debug mode (InitOptions::debug_collectives, DDP_DEBUG=1,
  // TORCH_DISTRIBUTED_DEBUG=DETAIL), also for a group of one: the checks
  // of DistributedDataParallel's usage rules that cost time.
  bool debug = false;
  // A collective failed (timed out, or a peer vanished): the backend's
  // threads may still be blocked on a dead or unreachable peer, so the
  // backend is never destroyed (see ~ProcessGroup).
  std::atomic<bool> abandoned_work{false};

  void monitor_step(int64_t iteration) {
    step.store(iteration);
    if (monitor) monitor->set_step(iteration);
  }

  // "all_reduce #12 on rank 1 of 2 (gloo)".
  std::string describe(const std::string& op, uint64_t seq) const;
};

// c10d's allreduce of `tensors`, through the group's shared memory when it
// has it and the tensor qualifies (shm::ShmGroup::supports), else through
// `backend`. The one entry point of every all_reduce (collectives, reducer).
c10::intrusive_ptr<c10d::Work> backend_all_reduce(ProcessGroupImpl& group,
                                                  compat::Backend& backend,
                                                  std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& options);

// c10d's broadcast of `tensors` from `options.rootRank`, through shared
// memory when every rank is on this host and the tensor qualifies, else
// through `backend`. The one entry point of every broadcast.
c10::intrusive_ptr<c10d::Work> backend_broadcast(ProcessGroupImpl& group,
                                                 compat::Backend& backend,
                                                 std::vector<at::Tensor>& tensors,
                                                 const c10d::BroadcastOptions& options);

// Note [Last words]: leaves `message` in the store of every live group of
// this process ("rank R: message"), for the ranks that will see this one's
// connections close (CollectiveMonitor::fatal_notes). Called by the
// terminate handler (error_file.cc); best effort, never blocks on a lock.
void publish_fatal_to_groups(const std::string& message) noexcept;

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

// The gradient bucket whose communication the calling thread starts while
// the scope lives (BucketComm::launch), for the flight records; -1 outside.
class BucketScope {
 public:
  explicit BucketScope(int bucket);
  ~BucketScope();
  BucketScope(const BucketScope&) = delete;
  BucketScope& operator=(const BucketScope&) = delete;

 private:
  int previous_;
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
