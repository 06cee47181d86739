#include "ddp/env.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ddp/error.h"

namespace ddp {
namespace {

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

// "node[01-04,07],gpu5" -> "node01"; "a,b" -> "a"; "host" -> "host".
std::string first_slurm_host(const std::string& list) {
  std::string first;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first.push_back(c);
  }
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  auto stop = range.find_first_of(",-]");
  return prefix + range.substr(0, stop);
}

// SLURM_TASKS_PER_NODE is like "2(x3),1": the first count is this node's when
// the tasks are spread evenly; prefer SLURM_NTASKS_PER_NODE when set.
std::optional<long long> slurm_local_world_size() {
  if (auto n = env_int("SLURM_NTASKS_PER_NODE")) return n;
  std::string s = env_str("SLURM_TASKS_PER_NODE");
  if (s.empty()) return std::nullopt;
  return parse_int(s.substr(0, s.find_first_of("(,")));
}

void read_master(LaunchEnv& env, const std::string& fallback_host) {
  std::string addr = env_str("MASTER_ADDR");
  env.master_addr = !addr.empty() ? addr
                    : !fallback_host.empty() ? fallback_host
                                             : std::string("127.0.0.1");
  if (auto port = env_int("MASTER_PORT")) {
    env.master_port = require_range("MASTER_PORT", *port, 1, 65535);
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

LaunchEnv read_launch_env() {
  LaunchEnv env;
  // Each source: the variable names for rank, size, local rank, local size.
  struct Source {
    LaunchSource kind;
    const char *rank, *size, *local_rank, *local_size;
  };
  const Source sources[] = {
      {LaunchSource::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK",
       "LOCAL_WORLD_SIZE"},
      {LaunchSource::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
       nullptr},
      {LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  for (const Source& s : sources) {
    auto rank = env_int(s.rank);
    if (!rank) continue;
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
    auto local_size = s.local_size ? env_int(s.local_size)
                                   : slurm_local_world_size();
    env.local_world_size =
        local_size ? require_range(s.local_size ? s.local_size
                                                : "SLURM_NTASKS_PER_NODE",
                                   *local_size, 1, env.world_size)
                   : env.world_size;
    auto local_rank = env_int(s.local_rank);
    env.local_rank = local_rank ? require_range(s.local_rank, *local_rank, 0,
                                                env.local_world_size - 1)
                                : env.rank % env.local_world_size;
    break;
  }
  std::string fallback_host;
  if (env.source == LaunchSource::kSlurm) {
    std::string nodes = env_str("SLURM_STEP_NODELIST");
    if (nodes.empty()) nodes = env_str("SLURM_JOB_NODELIST");
    if (!nodes.empty() && env.local_world_size < env.world_size) {
      fallback_host = first_slurm_host(nodes);
    }
  }
  read_master(env, fallback_host);
  std::string agent = env_str("TORCHELASTIC_USE_AGENT_STORE");
  env.use_agent_store = (agent == "True" || agent == "true" || agent == "1");
  if (auto rc = env_int("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = require_range("TORCHELASTIC_RESTART_COUNT", *rc, 0,
                                      1 << 30);
  }
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

}  // namespace ddp
