// Internal: the state of a ShmGroup, shared by shm_group.cc (set-up,
// communication thread) and shm_protocol.cc (Note [Shared-memory
// all-reduce]).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compat/torch_compat.h"
#include "shm/reduce_kernels.h"
#include "shm/segment.h"
#include "shm/shm_group.h"

namespace ddp::shm {

// The head of every segment: who owns it, and its phase counter (a futex
// word) with the number of ranks sleeping on it.
struct alignas(64) Control {
  static constexpr uint64_t kMagic = 0x6464702d73686d31ULL;  // "ddp-shm1"
  uint64_t magic = 0;
  int32_t pid = 0;
  int32_t rank = 0;
  alignas(64) std::atomic<uint32_t> phase{0};
  alignas(64) std::atomic<uint32_t> waiters{0};
  // The operation this rank is in, written before it signals "input ready"
  // (so a peer reads it after seeing that phase): ranks out of step are
  // caught here instead of reducing mismatched buffers.
  struct Op {
    uint64_t total = 0;   // elements of the whole all_reduce
    uint64_t offset = 0;  // of this chunk
    uint64_t count = 0;   // elements in this chunk
    uint64_t source = 0;  // byte offset of the chunk's data in this segment
    uint32_t dtype = 0;
    uint32_t op = 0;  // Op, or kBroadcastOp + the root's local index
  };
  static constexpr uint32_t kBroadcastOp = 16;
  alignas(64) Op current;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

// Segment layout: [Control | staging buffer | arena]. The staging buffer
// starts one page in; the arena (ShmGroup::allocate: DDP's buckets) follows.
constexpr size_t kHeaderBytes = 4096;

using Clock = std::chrono::steady_clock;

struct ShmGroup::State {
  int rank = 0, size = 1;
  std::vector<int> local;    // global ranks on this host, ascending
  int me = 0;                // my index in `local`
  int hosts = 1, host = 0;   // number of hosts, mine (ordered by lowest rank)
  // By local index: mine created, peers' opened. Shared: tensors from
  // allocate() keep my segment mapped while they live.
  std::vector<std::shared_ptr<Segment>> segments;
  std::vector<Control*> controls;    // by local index
  std::vector<char*> bases;          // by local index: the segment's start
  std::vector<pid_t> pids;           // by local index
  size_t staging_bytes = 0;
  size_t arena_bytes = 0;
  char* staging(int k) const { return bases[k] + kHeaderBytes; }
  size_t arena_begin() const { return kHeaderBytes + staging_bytes; }

  // The arena's free blocks, offset -> bytes (any thread). Shared with the
  // deleters of allocate()'s tensors, which may outlive the group. Each rank
  // allocates on its own: a chunk's offset travels in Control::current.source.
  struct Arena {
    std::mutex mu;
    std::map<size_t, size_t> free;  // guarded by mu
  };
  std::shared_ptr<Arena> arena = std::make_shared<Arena>();
  size_t one_shot_max_bytes = 0;
  c10::intrusive_ptr<compat::Backend> leaders;  // host leaders only, hosts > 1

  // Communication thread and its queue (guarded by mu).
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::atomic<bool> cancel{false};  // the group is being destroyed

  // Communication thread only.
  uint32_t phase = 0;   // my last signalled phase
  std::string broken;   // why the shared-memory state is unusable ("" if fine)
};

// One all-reduce on the communication thread (shm_protocol.cc): `data`
// (contiguous, `count` elements) in place, across every rank of the group.
// Throws ddp::TimeoutError or ddp::CommError.
void run_all_reduce(ShmGroup::State& s, char* data, size_t count, DType dtype, Op op,
                    Clock::time_point deadline, std::chrono::milliseconds timeout);

// One broadcast on the communication thread (shm_protocol.cc): `bytes` of
// `data` from local rank `root` to every local rank, through the root's
// staging buffer (single host only). Throws as run_all_reduce.
void run_broadcast(ShmGroup::State& s, char* data, size_t bytes, DType dtype, int root,
                   Clock::time_point deadline, std::chrono::milliseconds timeout);

// Waits until every local peer has signalled this rank's last phase: it has
// finished reading this rank's buffers (communication thread only).
void wait_for_readers(ShmGroup::State& s, Clock::time_point deadline,
                      std::chrono::milliseconds timeout);

}  // namespace ddp::shm
