// The launch environment: which rank this process is, how many there are, and
// where the rendezvous lives, read from the variables that launchers set.
//
// Sources, in order of precedence (the first one whose rank variable is set
// wins):
//   1. torchrun / ddprun / torch.distributed.launch --use-env:
//      RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//      MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT
//      (and ddprun's DDP_TERMINAL)
//   2. SLURM (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//      SLURM_NTASKS_PER_NODE, else this node's (SLURM_NODEID's) entry of
//      SLURM_TASKS_PER_NODE ("2(x3),1")
//   3. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   4. none: a single process (rank 0 of 1).
// MASTER_ADDR and MASTER_PORT are honoured with every source. Without them,
// a multi-node SLURM job (SLURM_NNODES > 1, or fewer tasks per node than
// tasks) meets on the first node of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
// ("node[03-05],gpu1" -> node03), a single-node job on 127.0.0.1, and the
// port defaults to 29500 (PyTorch's default). TORCHELASTIC_RESTART_COUNT
// and DDP_TERMINAL are read with every source.
// Every variable ddp reads or writes, ddp's own (DDP_*, GLOO_SOCKET_IFNAME)
// included, with its default: docs/environment.md.
//
// Thread safety: these functions read the process environment (getenv) and
// are safe to call concurrently with each other, not with setenv.
#pragma once

#include <optional>
#include <string>

namespace ddp {

// Where the rank information came from.
enum class LaunchSource { kTorchrun, kSlurm, kOpenMpi, kSingleProcess };

// Human-readable name of a LaunchSource ("torchrun", "slurm", ...).
const char* to_string(LaunchSource source);

struct LaunchEnv {
  int rank = 0;              // global rank, in [0, world_size)
  int world_size = 1;        // number of processes in the job, >= 1
  int local_rank = 0;        // rank on this node; picks the device (cuda:N)
  int local_world_size = 1;  // processes on this node
  std::string master_addr = "127.0.0.1";  // rendezvous host
  int master_port = 29500;                // rendezvous TCP port, 1..65535
  LaunchSource source = LaunchSource::kSingleProcess;
  // torchrun hosts the store in its agent: every rank is a store client and
  // keys live under "/worker/attempt_<restart_count>".
  bool use_agent_store = false;
  // TORCHELASTIC_RESTART_COUNT: the attempt, 0 for the first, counting the
  // launcher's restarts of the worker group (0..2^30).
  int restart_count = 0;
  // DDP_TERMINAL=1 (any other value, or unset: false): this process's stdout
  // is a pipe, but ddprun relays what it writes to a terminal, so a progress
  // bar may be drawn (ddprun sets it for such workers only, never inherited).
  bool stdout_reaches_terminal = false;
};

// Reads the launch environment described above.
// Throws InvalidArgument naming the variable when one is not an integer, is
// out of range (RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, a port
// outside 1..65535), when RANK is set without WORLD_SIZE (likewise for SLURM
// and Open MPI), when WORLD_SIZE > 1 is set without any rank variable, or
// when SLURM_TASKS_PER_NODE is malformed.
LaunchEnv read_launch_env();

// The legacy torch.distributed.launch convention: finds "--local_rank=N",
// "--local-rank=N", "--local_rank N" or "--local-rank N" in argv. When found
// and `remove` is true, the argument(s) are removed from argv and argc is
// decreased, so that the remaining arguments can go to another parser.
// Returns nullopt when absent. Throws InvalidArgument naming the flag when N
// is missing or not a non-negative integer.
std::optional<int> local_rank_from_argv(int& argc, char** argv,
                                        bool remove = true);

}  // namespace ddp
