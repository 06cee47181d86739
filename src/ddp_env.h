// ddp's own environment variables (docs/environment.md, "ddp's own"): the
// settings a user (or ddprun) gives the library without recompiling. The
// launch variables are include/ddp/env.h's; both are read in src/env.cc
// only, by the names of src/env_names.h.
//
// read_ddp_env() reads them all each time it is called; its callers decide
// when, and the library reads them where it always has: the shared-memory
// switch, the debug mode and the stall warning when a process group is
// created (new_process_group), the rendezvous file and the Gloo interface
// in its rendezvous, the log level and the rank prefix once, at the first
// line that needs them (logging.cc; set_log_level overrides the level),
// DDP_REDUCE_AT_WORLD_SIZE_1 when a DistributedDataParallel is constructed.
//
// Thread safety: as read_launch_env(): safe with other readers, not with
// setenv.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddp::detail {

struct DdpEnv {
  // DDP_RENDEZVOUS_FILE (ddprun --standalone): the ranks meet in this
  // FileStore instead of a TCP store. "" when unset.
  std::string rendezvous_file;
  // DDP_SHM: false when 0, false, False, off, OFF or no (docs/shared_memory.md).
  bool shared_memory = true;
  // DDP_DEBUG is 1, true, True, ON or on, or TORCH_DISTRIBUTED_DEBUG=DETAIL:
  // every collective is checked across ranks (collective_monitor.h).
  bool debug = false;
  // DDP_STALL_WARNING_S as set ("" when unset); stall_warning() checks it.
  std::string stall_warning_s;
  // The first interface of GLOO_SOCKET_IFNAME's comma-separated list ("" when
  // unset or empty): the one Gloo binds.
  std::string gloo_socket_ifname;
  // DDP_LOCAL_ADDR ("" when unset; ddprun --local-addr sets it): the local
  // address Gloo binds when GLOO_SOCKET_IFNAME does not name an interface.
  std::string local_addr;
  // DDP_LOG_LEVEL as set ("" when unset): logging.cc parses it, and reports
  // rather than throws when it is not a level.
  std::string log_level;
  // DDP_LOG_RANK_PREFIX: false when 0 (ddprun prefixes the lines itself).
  bool log_rank_prefix = true;
  // DDP_FLIGHT_RECORDER_DIR ("" when unset): where the flight recorder maps
  // its rings (ddp/flight_recorder.h).
  std::string flight_recorder_dir;
  // DDP_FLIGHT_RECORDER_ENTRIES as set ("" when unset); checked by
  // flight_recorder_entries().
  std::string flight_recorder_entries_text;
  // DDP_REDUCE_AT_WORLD_SIZE_1=1: DistributedDataParallel reduces its
  // buckets through the backend even alone in the group (tests of the NCCL
  // path on one GPU; benchmarks against Python DDP, which always does).
  bool reduce_alone = false;

  // DDP_STALL_WARNING_S in milliseconds; nullopt when unset or empty. Throws
  // InvalidArgument naming the variable when it is not a positive number of
  // seconds. Checked by its user (new_process_group), not by the read, so
  // that a bad value fails where it always has.
  std::optional<std::chrono::milliseconds> stall_warning() const;
  // DDP_FLIGHT_RECORDER_ENTRIES, or `default_entries` when unset; 0 turns
  // the recorder off. Throws InvalidArgument naming the variable when it is
  // not a whole number in [0, max_entries]. (The bounds are the flight
  // recorder's: flight::kDefaultCapacity, flight::kMaxCapacity.)
  uint32_t flight_recorder_entries(uint32_t default_entries, uint32_t max_entries) const;
};

DdpEnv read_ddp_env();

// Parses an environment variable as an integer. Returns nullopt when it is
// unset or empty; throws InvalidArgument naming the variable otherwise when it
// is not an integer.
std::optional<long long> env_int(const char* name);

}  // namespace ddp::detail
