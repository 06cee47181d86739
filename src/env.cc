#include "ddp/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "ddp/error.h"
#include "ddp_env.h"
#include "env_names.h"

namespace ddp {
namespace {

using namespace env_names;
using detail::env_int;

// Parses "[0-9]+" (and a leading '-') fully; nullopt on anything else.
std::optional<long long> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

int require_range(const char* name, long long v, long long lo, long long hi) {
  if (v < lo || v > hi) {
    throw InvalidArgument(fmt::format(
        "environment variable {}={} is out of range: expected {}..{}", name, v,
        lo, hi));
  }
  return static_cast<int>(v);
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The first host of a SLURM host list: each bracketed range contributes its
// first element. "node[01-04,07],gpu5" -> "node01"; "n[1-2]-ib[3-4]" ->
// "n1-ib3"; "a,b" -> "a"; "host" -> "host".
std::string first_slurm_host(const std::string& list) {
  std::string first;
  for (size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    if (list[i] != '[') {
      first.push_back(list[i]);
      continue;
    }
    size_t close = list.find(']', i);
    if (close == std::string::npos) close = list.size();
    std::string range = list.substr(i + 1, close - i - 1);
    first += range.substr(0, range.find_first_of(",-"));
    i = close;
  }
  return first;
}

// Tasks on node `node` from SLURM_TASKS_PER_NODE, which lists each node's
// count in node order with runs compressed: "2(x3),1" is 2, 2, 2, 1.
long long slurm_tasks_on_node(const std::string& list, long long node) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(fmt::format(
        "environment variable SLURM_TASKS_PER_NODE='{}' {}: expected a list "
        "like '2(x3),1'; set SLURM_NTASKS_PER_NODE to override",
        list, why));
  };
  long long first_node = 0;
  for (size_t pos = 0; pos <= list.size();) {
    size_t end = std::min(list.find(',', pos), list.size());
    std::string item = list.substr(pos, end - pos);
    std::optional<long long> repeat = 1;
    auto paren = item.find("(x");
    if (paren != std::string::npos && item.back() == ')') {
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    auto count = parse_int(item);
    if (!count || !repeat || *count < 1 || *repeat < 1) throw bad("is malformed");
    if (node < first_node + *repeat) return *count;
    first_node += *repeat;
    pos = end + 1;
  }
  throw bad(fmt::format("has no entry for SLURM_NODEID={}", node));
}

// This node's task count: SLURM_NTASKS_PER_NODE when set, else this node's
// (SLURM_NODEID's) entry of SLURM_TASKS_PER_NODE. `name` gets the variable
// used, for messages.
std::optional<long long> slurm_local_world_size(const char*& name) {
  name = "SLURM_NTASKS_PER_NODE";
  if (auto n = env_int(name)) return n;
  name = "SLURM_TASKS_PER_NODE";
  std::string s = env_str(name);
  if (s.empty()) return std::nullopt;
  long long node = env_int("SLURM_NODEID").value_or(0);
  return slurm_tasks_on_node(s, node);
}

// Without MASTER_ADDR, a multi-node SLURM job meets on its first node.
std::string slurm_master_host(const LaunchEnv& env) {
  std::string nodes = env_str("SLURM_STEP_NODELIST");
  if (nodes.empty()) nodes = env_str("SLURM_JOB_NODELIST");
  auto nnodes = env_int("SLURM_NNODES");
  bool multi_node = nnodes ? *nnodes > 1 : env.local_world_size < env.world_size;
  return !nodes.empty() && multi_node ? first_slurm_host(nodes) : std::string();
}

void read_master(LaunchEnv& env, const std::string& fallback_host) {
  std::string addr = env_str(kMasterAddr);
  env.master_addr = !addr.empty() ? addr
                    : !fallback_host.empty() ? fallback_host
                                             : std::string("127.0.0.1");
  if (auto port = env_int(kMasterPort)) {
    env.master_port = require_range(kMasterPort, *port, 1, 65535);
  }
}

}  // namespace

const char* to_string(LaunchSource source) {
  switch (source) {
    case LaunchSource::kTorchrun: return "torchrun";
    case LaunchSource::kSlurm: return "slurm";
    case LaunchSource::kOpenMpi: return "openmpi";
    case LaunchSource::kSingleProcess: return "single-process";
  }
  return "unknown";
}

namespace detail {
std::optional<long long> env_int(const char* name) {
  std::string s = env_str(name);
  if (s.empty()) return std::nullopt;
  auto v = parse_int(s);
  if (!v) {
    throw InvalidArgument(fmt::format(
        "environment variable {}='{}' is not an integer", name, s));
  }
  return v;
}
}  // namespace detail

namespace {

// Each launcher's variable names for rank, size, local rank, local size
// (SLURM's local size comes from slurm_local_world_size()).
struct Source {
  LaunchSource kind;
  const char *rank, *size, *local_rank, *local_size;
};

// Fills rank, world_size, local_rank, local_world_size from `s`. False when
// s's rank variable is not set.
bool read_source(const Source& s, LaunchEnv& env) {
  auto rank = env_int(s.rank);
  if (!rank) return false;
  auto size = env_int(s.size);
  if (!size) {
    throw InvalidArgument(fmt::format(
        "environment variable {} is set ({}) but {} is missing: set {} to "
        "the number of processes in the job",
        s.rank, *rank, s.size, s.size));
  }
  env.source = s.kind;
  env.world_size = require_range(s.size, *size, 1, 1 << 24);
  env.rank = require_range(s.rank, *rank, 0, env.world_size - 1);
  const char* local_size_name = s.local_size;
  auto local_size = s.local_size ? env_int(s.local_size)
                                 : slurm_local_world_size(local_size_name);
  env.local_world_size =
      local_size ? require_range(local_size_name, *local_size, 1, env.world_size)
                 : env.world_size;
  auto local_rank = env_int(s.local_rank);
  env.local_rank = local_rank ? require_range(s.local_rank, *local_rank, 0,
                                              env.local_world_size - 1)
                              : env.rank % env.local_world_size;
  return true;
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv env;
  const Source sources[] = {
      {LaunchSource::kTorchrun, kRank, kWorldSize, kLocalRank, kLocalWorldSize},
      {LaunchSource::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
       nullptr},
      {LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  bool found = false;
  for (const Source& s : sources) {
    if ((found = read_source(s, env))) break;
  }
  // WORLD_SIZE alone would silently run this process as a world of one
  // while the others wait for it (PyTorch's env:// also requires RANK).
  auto world_size = env_int(kWorldSize);
  if (!found && world_size && *world_size != 1) {
    throw InvalidArgument(fmt::format(
        "environment variable WORLD_SIZE={} is set but RANK is missing: set "
        "RANK to this process's rank in [0, {}), or unset WORLD_SIZE",
        *world_size, *world_size));
  }
  read_master(env, env.source == LaunchSource::kSlurm ? slurm_master_host(env)
                                                      : std::string());
  std::string agent = env_str(kUseAgentStore);
  env.use_agent_store = (agent == "True" || agent == "true" || agent == "1");
  if (auto rc = env_int(kRestartCount)) {
    env.restart_count = require_range(kRestartCount, *rc, 0, 1 << 30);
  }
  env.stdout_reaches_terminal = env_str(kTerminal) == "1";
  return env;
}

std::optional<int> local_rank_from_argv(int& argc, char** argv, bool remove) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    int consumed = 0;
    std::string value, flag;
    for (const char* name : {"--local_rank", "--local-rank"}) {
      if (arg == name) {
        flag = name;
        if (i + 1 >= argc) {
          throw InvalidArgument(fmt::format(
              "command-line flag {} needs a value, e.g. {}=0", name, name));
        }
        value = argv[i + 1];
        consumed = 2;
      } else if (arg.rfind(std::string(name) + "=", 0) == 0) {
        flag = name;
        value = arg.substr(std::strlen(name) + 1);
        consumed = 1;
      }
    }
    if (consumed == 0) continue;
    auto v = parse_int(value);
    if (!v || *v < 0 || *v > (1 << 20)) {
      throw InvalidArgument(fmt::format(
          "command-line flag {}='{}' is not a non-negative integer", flag,
          value));
    }
    if (remove) {
      for (int j = i; j + consumed <= argc; ++j) argv[j] = argv[j + consumed];
      argc -= consumed;
    }
    return static_cast<int>(*v);
  }
  return std::nullopt;
}

namespace detail {
namespace {

bool env_is_one_of(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  for (const char* x : values) {
    if (std::strcmp(v, x) == 0) return true;
  }
  return false;
}

}  // namespace

DdpEnv read_ddp_env() {
  DdpEnv env;
  env.rendezvous_file = env_str(kRendezvousFile);
  env.shared_memory = !env_is_one_of(kShm, {"0", "false", "False", "off", "OFF", "no"});
  env.debug = env_is_one_of(kDebug, {"1", "true", "True", "ON", "on"}) ||
              env_is_one_of(kTorchDistributedDebug, {"DETAIL"});
  env.stall_warning_s = env_str(kStallWarningS);
  const std::string ifnames = env_str(kGlooSocketIfname);
  env.gloo_socket_ifname = ifnames.substr(0, ifnames.find(','));
  env.local_addr = env_str(kLocalAddr);
  env.log_level = env_str(kLogLevel);
  env.flight_recorder_dir = env_str(kFlightRecorderDir);
  env.flight_recorder_entries_text = env_str(kFlightRecorderEntries);
  env.log_rank_prefix = env_str(kLogRankPrefix) != "0";
  env.reduce_alone = env_is_one_of(kReduceAlone, {"1", "true", "True", "ON", "on"});
  return env;
}

uint32_t DdpEnv::flight_recorder_entries(uint32_t default_entries, uint32_t max_entries) const {
  if (flight_recorder_entries_text.empty()) return default_entries;
  const std::optional<long long> v = parse_int(flight_recorder_entries_text);
  if (!v || *v < 0 || *v > max_entries) {
    throw InvalidArgument(fmt::format(
        "environment variable {}='{}' is not a number of entries in [0, {}] (0 turns the flight "
        "recorder off)",
        kFlightRecorderEntries, flight_recorder_entries_text, max_entries));
  }
  return static_cast<uint32_t>(*v);
}

std::optional<std::chrono::milliseconds> DdpEnv::stall_warning() const {
  if (stall_warning_s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(stall_warning_s.c_str(), &end);
  if (*end != '\0' || !(v > 0)) {
    throw InvalidArgument(fmt::format(
        "environment variable {}='{}' is not a positive number of seconds", kStallWarningS,
        stall_warning_s));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
}

}  // namespace detail
}  // namespace ddp
