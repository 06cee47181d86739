#include "launcher/worker_env.h"

#include <fmt/format.h>

#include <map>

namespace ddp::launcher {
namespace {

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
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it != env.end() && !it->second.empty()) {
    std::vector<std::string> devices = split(it->second, ',');
    if (local_rank < static_cast<int>(devices.size())) device = devices[local_rank];
  }
  env["CUDA_VISIBLE_DEVICES"] = device;
  env["LOCAL_RANK"] = "0";
}

}  // namespace

bool sets_omp_num_threads(const LaunchOptions& options, const char* const* base) {
  return options.nproc_per_node > 1 && !is_set(to_map(base), "OMP_NUM_THREADS");
}

std::vector<std::string> worker_environment(const LaunchOptions& options,
                                            int local_rank,
                                            const AttemptInfo& attempt,
                                            const std::string& error_file,
                                            const char* const* base) {
  std::map<std::string, std::string> env = to_map(base);
  const int rank = options.global_rank(local_rank);
  const std::string world = std::to_string(options.world_size());
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  if (options.virtual_local_rank) set_virtual_local_rank(env, local_rank);
  env["WORLD_SIZE"] = world;
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(options.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(options.nnodes);
  env["ROLE_RANK"] = std::to_string(rank);  // one role: role rank = rank
  env["ROLE_WORLD_SIZE"] = world;
  env["ROLE_NAME"] = options.role;
  env["MASTER_ADDR"] = attempt.master_addr;
  env["MASTER_PORT"] = std::to_string(attempt.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = options.run_id;
  env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (attempt.store_file.empty()) {
    env.erase("DDP_RENDEZVOUS_FILE");  // inherited from an outer launcher
  } else {
    env["DDP_RENDEZVOUS_FILE"] = attempt.store_file;
  }
  // Rank 0 hosts the store itself; an inherited value (ddprun under
  // torchrun) would send the workers looking for an agent store.
  env.erase("TORCHELASTIC_USE_AGENT_STORE");
  if (options.nproc_per_node > 1 && !is_set(env, "OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] = "1";
  }
  if (!is_set(env, "NCCL_ASYNC_ERROR_HANDLING")) env["NCCL_ASYNC_ERROR_HANDLING"] = "1";
  if (!is_set(env, "PYTHONUNBUFFERED")) env["PYTHONUNBUFFERED"] = "1";
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
