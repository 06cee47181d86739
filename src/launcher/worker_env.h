// What each worker is given: the torchrun environment variables and, in the
// legacy torch.distributed.launch mode, a --local_rank argument.
//
// Follows torchrun (torch/distributed/elastic/agent/server/
// local_elastic_agent.py) except that the workers' rank 0 hosts the store:
// TORCHELASTIC_USE_AGENT_STORE is removed from the environment.
#pragma once

#include <string>
#include <vector>

#include "launcher/options.h"

namespace ddp::launcher {

// Where and which attempt: one per start of the worker group.
struct AttemptInfo {
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT, 0 for the first
  std::string master_addr;
  int master_port = 0;
  // --standalone: a file in the launcher's private (0700) run directory
  // where ddp programs rendezvous instead of a TCP store, so that nothing
  // listens on the network (DDP_RENDEZVOUS_FILE). Empty otherwise.
  std::string store_file;
  // DDP_FLIGHT_RECORDER_DIR for the workers unless the user set it
  // (flight_report.h). Empty: none.
  std::string flight_dir;
};

// Where one worker's console output goes (worker_group.cc decides).
struct WorkerConsole {
  // ddprun prefixes each of the worker's console lines with its rank, so
  // ddp's logging should leave its own "[rankN]: " out.
  bool launcher_prefixes_lines = false;
  // The worker's stdout is a pipe whose lines the relay passes on to a
  // terminal (Note [Carriage-return updates]): progress bars may be drawn.
  bool stdout_reaches_terminal = false;
};

// The complete environment ("KEY=VALUE") of local rank `local_rank`: the
// launcher's own environment `base` (null-terminated, like environ) with
// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID and TORCHELASTIC_ERROR_FILE set; OMP_NUM_THREADS=1
// when unset and nproc_per_node > 1; TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and
// PYTHONUNBUFFERED=1 (torchrun's `python -u`) when unset;
// DDP_RENDEZVOUS_FILE when attempt.store_file is set (removed otherwise);
// DDP_LOG_RANK_PREFIX=0 when console.launcher_prefixes_lines and `base`
// does not set it (even to ""); DDP_TERMINAL=1 when
// console.stdout_reaches_terminal (removed otherwise: never inherited).
// TORCHELASTIC_USE_AGENT_STORE is removed. The names: src/env_names.h.
std::vector<std::string> worker_environment(const LaunchOptions& options,
                                            int local_rank,
                                            const AttemptInfo& attempt,
                                            const std::string& error_file,
                                            const char* const* base,
                                            const WorkerConsole& console = {});

// The program's argv for local rank `local_rank`: options.program, with
// "--local_rank=N" after the program name in the legacy mode (as
// torch.distributed.launch: `prog --local_rank=N args...`).
std::vector<std::string> worker_arguments(const LaunchOptions& options,
                                          int local_rank);

// Whether ddprun sets OMP_NUM_THREADS (so the caller prints torchrun's
// notice once): unset in `base` and more than one worker per node.
bool sets_omp_num_threads(const LaunchOptions& options, const char* const* base);

}  // namespace ddp::launcher
