// The names of the environment variables that ddprun writes for its workers
// (src/launcher/worker_env.cc) and ddp reads (src/env.cc, and the library
// code it serves), spelled once here so that the writer and the reader cannot
// drift apart. The table of every variable, with defaults and meanings:
// docs/environment.md. No libtorch: the launcher includes it too.
#pragma once

namespace ddp::env_names {

// torchrun's worker variables (written by ddprun and torchrun; read by
// read_launch_env(), include/ddp/env.h, unless said otherwise).
inline constexpr char kRank[] = "RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";  // ddprun removes it
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";  // src/error_file.cc
// Written for programs that read them; ddp does not.
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";

// ddp's own (read by read_ddp_env(), src/ddp_env.h, except DDP_TERMINAL:
// read_launch_env()).
inline constexpr char kRendezvousFile[] = "DDP_RENDEZVOUS_FILE";  // ddprun --standalone
inline constexpr char kLogRankPrefix[] = "DDP_LOG_RANK_PREFIX";   // ddprun: 0 when it prefixes
inline constexpr char kTerminal[] = "DDP_TERMINAL";               // ddprun: 1 through its relay
inline constexpr char kLogLevel[] = "DDP_LOG_LEVEL";
inline constexpr char kShm[] = "DDP_SHM";
inline constexpr char kDebug[] = "DDP_DEBUG";
inline constexpr char kTorchDistributedDebug[] = "TORCH_DISTRIBUTED_DEBUG";
inline constexpr char kStallWarningS[] = "DDP_STALL_WARNING_S";
inline constexpr char kGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";
inline constexpr char kLocalAddr[] = "DDP_LOCAL_ADDR";  // ddprun --local-addr
inline constexpr char kFlightRecorderDir[] = "DDP_FLIGHT_RECORDER_DIR";  // ddprun: its run directory
inline constexpr char kFlightRecorderEntries[] = "DDP_FLIGHT_RECORDER_ENTRIES";
inline constexpr char kReduceAlone[] = "DDP_REDUCE_AT_WORLD_SIZE_1";

// Written by ddprun for the program or its runtime, not read by libddp.
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";  // ddp-train reads it
inline constexpr char kNcclAsyncErrorHandling[] = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kTorchNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kPythonUnbuffered[] = "PYTHONUNBUFFERED";
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";  // --virtual-local-rank

}  // namespace ddp::env_names
