// The flight recorder's ring, as it lies in memory and in its file
// (docs/flight_recorder.md). No libtorch: the launcher and ddp-trace read it.
//
// Note [Flight ring]
// Each process group of each rank keeps a ring of its last `capacity`
// collectives: a fixed-size Header followed by `capacity` fixed-size
// Entries, plain bytes with no pointers. When DDP_FLIGHT_RECORDER_DIR is set
// (ddprun sets it for its workers) the ring is a shared mapping of a file in
// that directory, so the file holds the rank's record at every moment: a
// rank killed with SIGKILL, stopped with SIGSTOP or hung still leaves it,
// with no code running at its death. Otherwise the ring is anonymous memory
// and an event (a timeout, a failed collective, a fatal signal, SIGUSR1,
// ddp::dump_flight_recorder) writes it to a file of the working directory
// with write(2) alone, which a signal handler may call.
//
// Writers (any thread of the rank) serialize on a mutex; a reader in another
// process may read at any time, so each entry carries a guard that is odd
// while the entry is being written (a sequence lock): a reader that sees an
// odd guard, or an entry whose id does not fit its slot, skips it.
//
// The layout is the host's (little-endian x86-64 and aarch64): the files are
// read on the host that wrote them, or one like it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ddp::flight {

inline constexpr char kMagic[8] = {'D', 'D', 'P', 'F', 'L', 'T', '1', '\0'};
inline constexpr uint32_t kVersion = 1;
// PyTorch's default ring size (TORCH_FR_BUFFER_SIZE) is 2000 entries too.
inline constexpr uint32_t kDefaultCapacity = 2000;
inline constexpr uint32_t kMaxCapacity = 1u << 20;
// File names: "ddp_flight_<group>_rank<R>.bin" (flight_recorder.cc).
inline constexpr char kFilePrefix[] = "ddp_flight_";
inline constexpr char kFileSuffix[] = ".bin";

enum class State : uint32_t {
  kEmpty = 0,      // slot never written
  kStarted = 1,    // issued, not (yet) waited to completion
  kCompleted = 2,  // waited, succeeded
  kFailed = 3,     // raised an error (peer gone, ranks out of step, ...)
  kTimedOut = 4,   // exceeded its timeout
};

const char* state_name(State s);

struct Entry {
  std::atomic<uint32_t> guard;  // odd while being written
  uint32_t state;               // State
  uint64_t id;                  // position in the ring's history (slot = id % capacity)
  uint64_t seq;                 // the process group's collective number
  int64_t step;                 // DistributedDataParallel's iteration; -1: none yet
  int32_t bucket;               // gradient bucket index; -1: not a bucket's
  uint32_t reserved;
  int64_t start_us;             // Unix time, microseconds
  int64_t end_us;               // 0 while not ended
  char op[80];                  // "all_reduce of gradient bucket 0 of 2 (iteration 4)"
  char signature[120];          // "all_reduce SUM float32[16, 8]": compared across ranks
};
static_assert(sizeof(Entry) == 256, "the file layout");

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint32_t entry_size;
  uint32_t capacity;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t pid;
  int64_t created_us;
  std::atomic<uint64_t> written;  // entries ever started (the next id)
  std::atomic<uint32_t> events;   // events noted (timeouts, failures, signals, dumps)
  uint32_t reserved;
  int64_t event_us;               // time of the first event; 0: none
  char group[64];                 // InitOptions::group_name
  char backend[16];
  char host[64];
  // The first event's reason, then "; "-separated later ones while room
  // lasts: "all_reduce #12 on rank 0 of 2 (gloo) timed out after 30.0 s".
  char reason[808];
};
static_assert(sizeof(Header) == 1024, "the file layout");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared between processes");

inline size_t ring_bytes(uint32_t capacity) {
  return sizeof(Header) + static_cast<size_t>(capacity) * sizeof(Entry);
}

}  // namespace ddp::flight
