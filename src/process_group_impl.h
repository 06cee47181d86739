// Internal: what a ddp::ProcessGroup holds, and the one entry point of each
// backend operation that shared memory may take. Starting and waiting for
// operations: work.h.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collective_monitor.h"
#include "compat/torch_compat.h"
#include "flight/flight_recorder.h"
#include "shm/shm_group.h"
#include "ddp/error.h"
#include "ddp/process_group.h"

namespace ddp::detail {

struct ProcessGroupImpl {
  int rank = 0;
  int size = 1;
  std::string backend_name;
  // NCCL: the rank's CUDA device (where CPU tensors are staged); else cpu.
  c10::Device device{c10::kCPU};
  std::string address;  // rendezvous address, for messages
  std::chrono::milliseconds timeout{kDefaultTimeout};
  c10::intrusive_ptr<c10d::Store> store;  // the group's (prefixed) store
  // What new_group needs to make subgroups like this group (subgroup.cc):
  // the stall inspector's second store connection (null: `store`), Gloo's
  // local address and threads, the monitor's options, and the count of
  // new_group calls so far (every rank makes them in the same order).
  c10::intrusive_ptr<c10d::Store> publish_store;
  std::string gloo_address;
  int gloo_threads = 2;
  MonitorOptions monitor_options;
  std::atomic<uint64_t> next_subgroup{0};
  // A subgroup this rank is not in (new_group): rank is -1 and every
  // collective throws InvalidArgument with this message.
  std::string not_member;
  c10::intrusive_ptr<compat::Backend> backend;
  // Number of collectives started on this group; each gets the next one.
  std::atomic<uint64_t> next_seq{0};
  // Sends and receives, numbered apart (point_to_point.cc).
  std::atomic<uint64_t> next_p2p_seq{0};
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

  // After a timeout or a failed collective: marks the group abandoned and,
  // for NCCL, aborts its communicators (Note [Device waits] in work.h).
  void abandon();

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

}  // namespace ddp::detail
