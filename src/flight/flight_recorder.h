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
  // anonymous ring, written to `dump_dir` at events (created then, with its
  // parents); "" there: "<records_home()>/<UTC date-time>_pid<P>"
  // (flight_home.h).
  std::string dir;
  std::string dump_dir;
  uint32_t capacity = kDefaultCapacity;  // entries; 0: no recorder
  std::string group = "default", backend, host;
  int rank = 0, world_size = 1, local_rank = 0;
};

// Which events write an in-memory ring out (a mapped one is its file):
// Note [Kept flight records] in flight_recorder.cc.
enum class Keep {
  kAlways,               // a dump asked for (SIGUSR1, dump_flight_recorder)
  kIfAnyCollective,      // a fatal signal: when the ring holds a collective
  kIfUnfinishedCollective,  // an error or std::terminate: when one did not complete
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
  // ring whose contents `keep` asks for, writes the ring to path() and says
  // so on stderr ("ddp: flight record ... written to PATH"). With `in_signal_handler`
  // async-signal-safe (no lock, no allocation); otherwise it first waits,
  // briefly, for an entry being written. Thread-safe; of two events at the
  // same moment one reason may be dropped (both are counted). Returns
  // whether the file is complete.
  bool note_event(const char* reason, bool in_signal_handler = false,
                  Keep keep = Keep::kAlways) noexcept;

  // The ring's file: the mapped file, or where an event writes it.
  const std::string& path() const { return path_; }
  bool mapped() const { return mapped_; }

 private:
  FlightRecorder() = default;
  // create()'s steps: the ring's memory (a file of setup.dir mapped shared,
  // or anonymous memory dumped at an event), then its header.
  void* map_file(const RecorderSetup& setup, const std::string& name);
  void* map_memory(const RecorderSetup& setup, const std::string& name);
  void write_header(void* base, const RecorderSetup& setup);

  Header* header_ = nullptr;
  Entry* entries_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;
  dev_t device_ = 0;  // the mapped file's identity, to remove only our own
  ino_t inode_ = 0;
  std::string path_;
  std::string tmp_prefix_;  // anonymous ring: its dumps are written as <prefix><n>, then renamed
  std::vector<std::string> dump_dirs_;  // anonymous ring: dump_dir and its parents, outermost first
  std::string notice_;      // anonymous ring: the line on stderr after its first dump
  std::atomic<bool> noticed_{false};
  bool wanted(Keep keep) const noexcept;
  std::mutex mu_;           // writers of entries
  std::atomic_flag reason_busy_ = ATOMIC_FLAG_INIT;
};

// note_event(reason, in_signal_handler) on every live recorder of the
// process. Async-signal-safe with `in_signal_handler`.
void note_event_everywhere(const char* reason, bool in_signal_handler = false,
                           Keep keep = Keep::kAlways) noexcept;

// Creates `dir` (and its parents) and checks that files can be made in it.
// Throws ddp::InvalidArgument naming it, DDP_FLIGHT_RECORDER_DIR and how to
// turn the recorder off. new_process_group calls it before the rendezvous,
// so that every rank fails alike.
void prepare_directory(const std::string& dir);

// path() of every live recorder of the process.
std::vector<std::string> live_paths();

// The SIGABRT that follows comes from ddp's own terminate handler, which
// has noted the event already: the fatal-signal handler adds none.
// Async-signal-safe.
void abort_follows() noexcept;

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
