// The intra-host shared-memory all-reduce of a Gloo process group.
//
// Note [Shared-memory all-reduce]
// Ranks that share a host (same host name, boot id, IPC and network
// namespace, and /dev/shm) each own a segment of shared memory (Note
// [Shared memory lifetime], segment.h) holding a control block and a
// staging buffer, and map their peers'. An all_reduce of a CPU tensor runs
// on the group's communication thread, chunk by chunk (a chunk fills the
// staging buffer), in steps separated by phase counters:
//   0. wait until every local peer has finished the previous operation
//      (it signalled "done reading" for it), then copy the chunk into my
//      staging buffer;
//   1. signal "input ready", wait for every local peer's;
//   2. one-shot (small chunks): sum all staging buffers into my tensor;
//      two-shot (large): sum my 1/L slice of every buffer into my own
//      buffer's slice, signal, wait, copy every slice from its owner;
//   3. signal "done reading" (the next operation waits for it).
// Every element is summed in local-rank order by one rank (two-shot) or by
// all ranks alike (one-shot), so the replicas stay bitwise identical.
// Across hosts (hierarchical): the local all-reduce, then an all_reduce of
// the host sums among the hosts' leaders (their lowest rank) with Gloo,
// then a local broadcast from the leader through the leader's buffer.
//
// Waiting: each rank's phase counter is a futex word in its control block.
// A waiter spins briefly, then sleeps on the futex (the signaller wakes it
// only when a waiter is registered), so a rank never burns the core another
// rank needs (W ranks on fewer cores). Every wait is bounded by the
// operation's timeout and checks every 100 ms that the peer's process is
// alive: a dead peer fails the operation at once with CommError naming it.
// After any failure the group's shared-memory state is undefined and every
// later operation fails (as any process group after a timeout).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace ddp::shm {

struct ShmSetup {
  c10::intrusive_ptr<c10d::Store> store;  // the group's (prefixed) store
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  bool enabled = true;        // InitOptions::shared_memory and DDP_SHM
  std::string gloo_address;   // for the leaders' Gloo group across hosts
  int gloo_threads = 2;
  // Staging bytes per rank (rounded to pages); 0: the default, 32 MiB or
  // less when /dev/shm is small (at least 1 MiB, or no shared memory).
  size_t staging_bytes = 0;
  // Largest chunk reduced one-shot (every rank sums everything).
  size_t one_shot_max_bytes = 256 << 10;
};

class ShmGroup {
 public:
  // Collective: every rank of the group calls it, after the rendezvous.
  // Returns the engine, or null with `reason` saying why every rank uses
  // Gloo alone: disabled, no two ranks on one host, or a rank that cannot
  // use /dev/shm (its reason, e.g. too little room). All ranks take the
  // same decision. Throws TimeoutError / CommError when the store fails.
  static std::unique_ptr<ShmGroup> create(const ShmSetup& setup, std::string& reason);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Whether all_reduce takes `tensor` with `op`: a dense CPU tensor of
  // float32/64, float16, bfloat16, int32 or int64, and SUM, MIN, MAX or
  // PRODUCT. Depends only on what every rank passes alike, so the ranks
  // agree on the path.
  static bool supports(const at::Tensor& tensor, c10d::ReduceOp op);

  // Starts the all_reduce of `tensor` in place; operations run in the
  // order started. The Work completes when `tensor` holds the result, or
  // fails with ddp::TimeoutError / ddp::CommError naming the rank at fault.
  // `tensor` must stay alive and untouched until then.
  c10::intrusive_ptr<c10d::Work> all_reduce(const at::Tensor& tensor, c10d::ReduceOp op,
                                            std::chrono::milliseconds timeout);

  // Starts the broadcast of `tensor` from global rank `root` to every rank,
  // when every rank of the group is on this host and the tensor qualifies
  // (supports(tensor, SUM)); else returns null and the caller uses Gloo.
  // The Work as all_reduce's.
  c10::intrusive_ptr<c10d::Work> broadcast(const at::Tensor& tensor, int root,
                                           std::chrono::milliseconds timeout);

  // A CPU tensor of `numel` elements of `dtype` in this rank's shared
  // segment, or an undefined tensor when there is no room (then use
  // ordinary memory). An all_reduce of it (or of a slice of it) reads it in
  // place, without copying it into the staging buffer: DDP's buckets live
  // here. The tensor keeps the segment mapped while it lives, even after
  // the group is destroyed. Thread-safe.
  at::Tensor allocate(int64_t numel, at::ScalarType dtype);

  // Blocks until every local peer has finished reading this rank's buffers
  // for the operations started so far. Call it before writing into a
  // tensor from allocate() whose all_reduce has completed here but may
  // still be read by a slower peer (DDP: before the next backward writes
  // gradients into its buckets). Throws as all_reduce's Work.
  void fence(std::chrono::milliseconds timeout);

  int local_size() const;
  int hosts() const;

  struct State;

 private:
  explicit ShmGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ddp::shm
