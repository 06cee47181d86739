#include "launcher/worker_env.h"

#include <fmt/format.h>

#include <map>

#include "env_names.h"

namespace ddp::launcher {
namespace {

using namespace env_names;

std::map<std::string, std::string> to_map(const char* const* base) {
  std::map<std::string, std::string> env;
  for (const char* const* e = base; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

bool is_set(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  return it != env.end() && !it->second.empty();
}

// torchrun's --virtual-local-rank: each worker sees its own device as
// device 0 (the local_rank-th of an inherited CUDA_VISIBLE_DEVICES list).
void set_virtual_local_rank(std::map<std::string, std::string>& env, int local_rank) {
  std::string device = std::to_string(local_rank);
  auto it = env.find(kCudaVisibleDevices);
  if (it != env.end() && !it->second.empty()) {
    std::vector<std::string> devices = split(it->second, ',');
    if (local_rank < static_cast<int>(devices.size())) device = devices[local_rank];
  }
  env[kCudaVisibleDevices] = device;
  env[kLocalRank] = "0";
}

}  // namespace

bool sets_omp_num_threads(const LaunchOptions& options, const char* const* base) {
  return options.nproc_per_node > 1 && !is_set(to_map(base), kOmpNumThreads);
}

std::vector<std::string> worker_environment(const LaunchOptions& options,
                                            int local_rank,
                                            const AttemptInfo& attempt,
                                            const std::string& error_file,
                                            const char* const* base,
                                            const WorkerConsole& console) {
  std::map<std::string, std::string> env = to_map(base);
  const int rank = options.global_rank(local_rank);
  const std::string world = std::to_string(options.world_size());
  env[kRank] = std::to_string(rank);
  env[kLocalRank] = std::to_string(local_rank);
  if (options.virtual_local_rank) set_virtual_local_rank(env, local_rank);
  env[kWorldSize] = world;
  env[kLocalWorldSize] = std::to_string(options.nproc_per_node);
  env[kGroupRank] = std::to_string(options.node_rank);
  env[kGroupWorldSize] = std::to_string(options.nnodes);
  env[kRoleRank] = std::to_string(rank);  // one role: role rank = rank
  env[kRoleWorldSize] = world;
  env[kRoleName] = options.role;
  env[kMasterAddr] = attempt.master_addr;
  env[kMasterPort] = std::to_string(attempt.master_port);
  env[kRestartCount] = std::to_string(attempt.restart_count);
  env[kMaxRestarts] = std::to_string(options.max_restarts);
  env[kRunId] = options.run_id;
  env[kErrorFile] = error_file;
  if (!options.local_addr.empty()) env[kLocalAddr] = options.local_addr;
  if (attempt.store_file.empty()) {
    env.erase(kRendezvousFile);  // inherited from an outer launcher
  } else {
    env[kRendezvousFile] = attempt.store_file;
  }
  // The flight recorder's rings go to the run directory, where ddprun reads
  // them when the attempt fails; a user's own directory wins.
  if (!attempt.flight_dir.empty() && !is_set(env, kFlightRecorderDir)) {
    env[kFlightRecorderDir] = attempt.flight_dir;
  }
  // Rank 0 hosts the store itself; an inherited value (ddprun under
  // torchrun) would send the workers looking for an agent store.
  env.erase(kUseAgentStore);
  if (options.nproc_per_node > 1 && !is_set(env, kOmpNumThreads)) {
    env[kOmpNumThreads] = "1";
  }
  // torchrun 2.x's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (NCCL errors end the
  // process); the old name, if the user set it, is left to c10d (which
  // reads it too), so that one setting is not overridden by the other.
  if (!is_set(env, kNcclAsyncErrorHandling) && !is_set(env, kTorchNcclAsyncErrorHandling)) {
    env[kTorchNcclAsyncErrorHandling] = "1";
  }
  if (!is_set(env, kPythonUnbuffered)) env[kPythonUnbuffered] = "1";
  // ddprun prefixes every console line with the rank: ddp's logging
  // (logging.h) leaves its own "[rankN]: " out, unless the user set the
  // variable (to anything, even "").
  if (console.launcher_prefixes_lines && env.count(kLogRankPrefix) == 0) {
    env[kLogRankPrefix] = "0";
  }
  // Never inherited: only this launcher's console counts.
  env.erase(kTerminal);
  if (console.stdout_reaches_terminal) env[kTerminal] = "1";
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

std::vector<std::string> worker_arguments(const LaunchOptions& options,
                                          int local_rank) {
  std::vector<std::string> argv = options.program;
  if (options.legacy_local_rank_arg) {
    // Where torch.distributed.launch puts it: before the program's own
    // arguments, so that a trailing "--" or REMAINDER argument cannot eat it.
    argv.insert(argv.begin() + 1, fmt::format("--local_rank={}", local_rank));
  }
  return argv;
}

}  // namespace ddp::launcher
