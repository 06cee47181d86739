// A POSIX shared-memory segment of one rank, mapped by the ranks on its host.
//
// Note [Shared memory lifetime]
// Each rank creates its own segment (shm_open with O_CREAT | O_EXCL, mode
// 0600: only this user can open it; the name holds 128 random bits chosen
// at the rendezvous, so no other job can guess it), maps it, and publishes
// that it exists; its co-located peers open and map it; once every peer
// has mapped every segment, each rank unlinks its own name. From then on
// nothing is left in /dev/shm whatever happens (exit, crash, SIGKILL): the
// memory lives as long as some rank keeps its mapping. The window between
// creation and unlink is the rendezvous; a rank killed inside it leaves a
// name behind, which carries the creator's pid so that the next job on the
// host removes it (remove_stale_segments).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::shm {

class Segment {
 public:
  // Creates `name` ("/ddp-..."), `bytes` long, with its first `reserved`
  // bytes backed by memory now (tmpfs otherwise allocates pages on first
  // touch, and a full /dev/shm then kills the process with SIGBUS), and
  // maps it read-write. Throws CommError naming the segment and the
  // system's reason (e.g. no space left).
  static Segment create(const std::string& name, size_t bytes, size_t reserved);
  // Opens and maps an existing segment (a peer's); same errors.
  static Segment open(const std::string& name, size_t bytes);

  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();  // unmaps; unlinks the name too if it is still ours

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Removes the name from /dev/shm; the mapping stays valid. Idempotent.
  void unlink() noexcept;
  // Backs [offset, offset + bytes) of a segment this process created with
  // memory; false when /dev/shm has no room (or for a peer's segment).
  bool reserve(size_t offset, size_t bytes) noexcept;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owns_name_ = false;
  int fd_ = -1;  // kept open by the creator, for reserve()
};

// The segment name of `rank` for a job's `token`: "/ddp-<token>-<pid>-<rank>".
std::string segment_name(const std::string& token, pid_t pid, int rank);

// Free bytes of the file system behind /dev/shm, or -1 when it cannot be
// used (missing, not writable).
int64_t dev_shm_free_bytes();

// Removes /dev/shm/ddp-* names whose creating process is gone (a rank
// killed inside the rendezvous window of Note [Shared memory lifetime]).
// Only names of this user are touched. Never throws.
void remove_stale_segments() noexcept;

}  // namespace ddp::shm
