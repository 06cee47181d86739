// The writer of Note [Flight ring] (flight_format.h): one FlightRecorder per
// process group of a rank, fed by start_work and WorkImpl::wait (work.cc).
// No libtorch.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "flight/flight_format.h"

namespace ddp::flight {

struct RecorderSetup {
  // DDP_FLIGHT_RECORDER_DIR: the ring is a mapped file there, kept after an
  // event or an abnormal end, removed with the group otherwise. "": an
  // anonymous ring, written to `dump_dir` at events.
  std::string dir;
  std::string dump_dir = ".";
  uint32_t capacity = kDefaultCapacity;  // entries; 0: no recorder
  std::string group = "default", backend, host;
  int rank = 0, world_size = 1, local_rank = 0;
};

class FlightRecorder {
 public:
  // Null when setup.capacity is 0. Throws ddp::InvalidArgument naming the
  // file and DDP_FLIGHT_RECORDER_DIR when the mapped file cannot be made.
  static std::unique_ptr<FlightRecorder> create(const RecorderSetup& setup);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records a collective as started; returns its id for ended(). Strings
  // longer than their fields are cut (with "..."). Thread-safe.
  uint64_t started(uint64_t seq, std::string_view op, std::string_view signature, int64_t step,
                   int bucket);
  // Marks entry `id` completed, failed or timed out (no-op when the ring has
  // wrapped past it). Thread-safe.
  void ended(uint64_t id, State state);

  // Notes an event (appends `reason`, counts it) and, for an anonymous
  // ring, writes the ring to path(). With `in_signal_handler`
  // async-signal-safe (no lock, no allocation); otherwise it first waits,
  // briefly, for an entry being written. Thread-safe; of two events at the
  // same moment one reason may be dropped (both are counted). Returns
  // whether the file is complete.
  bool note_event(const char* reason, bool in_signal_handler = false) noexcept;

  // The ring's file: the mapped file, or where an event writes it.
  const std::string& path() const { return path_; }
  bool mapped() const { return mapped_; }

 private:
  FlightRecorder() = default;

  Header* header_ = nullptr;
  Entry* entries_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;
  dev_t device_ = 0;  // the mapped file's identity, to remove only our own
  ino_t inode_ = 0;
  std::string path_;
  std::string tmp_prefix_;  // anonymous ring: its dumps are written as <prefix><n>, then renamed
  std::mutex mu_;           // writers of entries
  std::atomic_flag reason_busy_ = ATOMIC_FLAG_INIT;
};

// note_event(reason, in_signal_handler) on every live recorder of the
// process. Async-signal-safe with `in_signal_handler`.
void note_event_everywhere(const char* reason, bool in_signal_handler = false) noexcept;

// Creates `dir` (and its parents) and checks that files can be made in it.
// Throws ddp::InvalidArgument naming it, DDP_FLIGHT_RECORDER_DIR and how to
// turn the recorder off. new_process_group calls it before the rendezvous,
// so that every rank fails alike.
void prepare_directory(const std::string& dir);

// path() of every live recorder of the process.
std::vector<std::string> live_paths();

// Installs, once per process, handlers that note an event on every live
// recorder: SIGUSR1 (the process goes on), and SIGSEGV, SIGBUS, SIGILL,
// SIGFPE and SIGABRT (the signal's default action follows, so the exit
// status is unchanged). A signal whose disposition is not the default (the
// program's own handler) is left alone.
void install_signal_handlers();

// "ddp_flight_<group>_rank<R>.bin": characters other than [A-Za-z0-9._-]
// of the group name become '_'. (A second live group of the same name in
// one process gets "..._rank<R>.<n>.bin".)
std::string file_name(const std::string& group, int rank);

}  // namespace ddp::flight
