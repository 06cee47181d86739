// ddprun --help: the text of every flag and the closing notes, kept apart
// from the parsing so that both read easily. docs/launcher.md says the same
// at more length.
#pragma once

namespace ddp::launcher {

inline constexpr const char* kHelpDescription =
    "ddprun: runs PROGRAM on N processes per node as one data-parallel job, "
    "like torchrun (without Python).";

inline constexpr const char* kHelpNproc =
    "Workers on this node: a number, cpu (one per CPU), gpu (one per GPU) or "
    "auto (gpu if any, else cpu). Default 1";
inline constexpr const char* kHelpNnodes =
    "Number of nodes: N, or MIN:MAX for an elastic job (with --rdzv-backend "
    "c10d; it starts with MIN to MAX nodes and restarts its workers when a "
    "node joins or is lost). Default 1";
inline constexpr const char* kHelpNodeRank =
    "Rank of this node, 0..nnodes-1. Global rank = node_rank * nproc + "
    "local_rank. Default 0; with --rdzv-backend c10d and --nnodes > 1, "
    "assigned as nodes join (the rendezvous' host is 0)";
inline constexpr const char* kHelpMasterAddr =
    "Address of node 0, where global rank 0 hosts the store. Default "
    "127.0.0.1";
inline constexpr const char* kHelpMasterPort =
    "Port of rank 0's store (MASTER_PORT). With --nnodes > 1 the launchers "
    "first meet on it too. Checked free on node 0 before start. Default 29500";
inline constexpr const char* kHelpStandalone =
    "One node, a free port on 127.0.0.1 (a new one on every restart)";
inline constexpr const char* kHelpMaxRestarts =
    "Restart the whole worker group (on every node) up to N times after a "
    "failure, with TORCHELASTIC_RESTART_COUNT incremented. Default 0";
inline constexpr const char* kHelpMonitor =
    "Longest sleep, in seconds, between checks of the workers (ddprun also "
    "wakes at once on every exit and signal). Default 5";
inline constexpr const char* kHelpGrace =
    "Seconds between SIGTERM and SIGKILL when stopping workers. Default 5";
inline constexpr const char* kHelpLogDir =
    "Keep each worker's stdout and stderr here, one file per rank per "
    "restart: DIR/RUNID_xxxxxx/attempt_K/LOCAL_RANK/{stdout,stderr}.log, and "
    "the worker's error.json";
inline constexpr const char* kHelpRedirects =
    "Send streams to the log files only, not the console: 0 none, 1 stdout, "
    "2 stderr, 3 both, or per local rank like 0:1,1:2. Default 0";
inline constexpr const char* kHelpTee =
    "Write streams to the log files as well as the console (same values as "
    "--redirects). Default 0";
inline constexpr const char* kHelpFilter =
    "Show only these local ranks on the console, like 0 or 0,2 (log files "
    "keep every rank)";
inline constexpr const char* kHelpRunId =
    "Job id, given to workers as TORCHELASTIC_RUN_ID; every node must pass "
    "the same. Default none";
inline constexpr const char* kHelpRole = "ROLE_NAME of the workers. Default default";
inline constexpr const char* kHelpRdzvBackend =
    "static (each node passes --node-rank) or c10d (the same line on every "
    "node: node ranks assigned as nodes arrive; needed for --nnodes MIN:MAX)";
inline constexpr const char* kHelpRdzvEndpoint =
    "host:port; sets --master-addr and --master-port";
inline constexpr const char* kHelpRdzvConf =
    "key=value,... of which ddprun reads join_timeout (s, default 600), "
    "keep_alive_interval (s, default 5), keep_alive_max_attempt (default "
    "3), last_call_timeout (s, default 30: how long an elastic job waits for "
    "more nodes once MIN are in) and is_host (true/false; default: whether the endpoint is an "
    "address of this machine); others are ignored";
inline constexpr const char* kHelpNoPython =
    "Accepted for torchrun scripts: ddprun always runs PROGRAM itself";
inline constexpr const char* kHelpModule =
    "Not supported (needs Python): run `ddprun python3 -u -m MODULE`";
inline constexpr const char* kHelpRunPath = "Not supported (needs Python)";
inline constexpr const char* kHelpStartMethod =
    "Accepted for torchrun scripts and ignored: workers are always new "
    "processes";
inline constexpr const char* kHelpUseEnv =
    "With --legacy-launch: do not append --local_rank (the workers read "
    "LOCAL_RANK)";
inline constexpr const char* kHelpLegacy =
    "Behave like python -m torch.distributed.launch: append "
    "--local_rank=LOCAL_RANK to each worker's arguments";

inline constexpr const char* kHelpShutdownTimeout =
    "torchrun's name for --grace-period (seconds between SIGTERM and "
    "SIGKILL); default from TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
inline constexpr const char* kHelpSignals =
    "Signals that stop the job and are forwarded to every worker, like "
    "SIGTERM,SIGINT,SIGHUP,SIGQUIT (the default); add SIGUSR1,SIGUSR2 for "
    "SLURM";
inline constexpr const char* kHelpVirtualLocalRank =
    "Give every worker LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES set to its own "
    "device (the LOCAL_RANK-th entry of an inherited CUDA_VISIBLE_DEVICES, "
    "else its local rank)";
inline constexpr const char* kHelpEventLogHandler =
    "torchrun's event log handler: only null (the default: no event log) "
    "is supported";
inline constexpr const char* kHelpLogsSpecs =
    "torchrun's LogsSpecs plugin (a Python entry point): not supported; "
    "use --log-dir, -r and -t";
inline constexpr const char* kHelpLocalAddr =
    "An address of this node, for hosts with several interfaces: the "
    "workers' Gloo binds it (DDP_LOCAL_ADDR; GLOO_SOCKET_IFNAME wins) and "
    "the other nodes see it. Default: the address that routes to the master";
inline constexpr const char* kHelpNumaBinding =
    "Not supported: bind workers yourself (numactl, taskset) or run under "
    "torchrun";
inline constexpr const char* kHelpLogLinePrefix =
    "Prefix of every console line of a worker instead of [rankN]:, with "
    "${role_name}, ${local_rank}, ${rank} and ${hostname} substituted, like "
    "'${hostname}:${rank}: ' (also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)";
inline constexpr const char* kHelpPrintCompletion =
    "Not supported: ddprun ships no shell completion script";
inline constexpr const char* kHelpDuplicateFilters =
    "Not supported: use -t/--tee with --log-dir and grep the log files";

inline constexpr const char* kHelpFooter = R"(
Every flag also accepts underscores (--nproc_per_node), and most take their
default from PET_<FLAG> environment variables, as in torchrun.

Workers get: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE; OMP_NUM_THREADS=1 when unset and
nproc > 1; TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and PYTHONUNBUFFERED=1 when unset.
Global rank 0 hosts the c10d TCPStore at MASTER_ADDR:MASTER_PORT.

Output: with more than one rank on the console each line is prefixed
[rankN]: (whole lines, never mixed). Each worker runs in its own process group;
workers die with ddprun.

Failures: the first worker to exit non-zero or by a signal is the root cause.
ddprun sends SIGTERM to the other workers, SIGKILL after --grace-period, prints
a summary (root cause first: rank, host, exit code or signal, time, its last
stderr lines, its error file) and exits 1, or restarts the group if
--max-restarts allows. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to
every worker (ddprun then exits 128+signal); a second one kills at once.

Multi-node (--nnodes > 1): the launchers meet at --master-addr:--master-port,
start and stop every attempt together, and give up when a node stops
answering for keep_alive_interval * keep_alive_max_attempt seconds.
Restarts restart every node's workers. --nnodes MIN:MAX (with --rdzv-backend
c10d) is elastic: a round starts with MIN..MAX nodes; a node that joins or is
lost ends it, and the workers restart on the nodes there are (no restart is
used up; docs/launcher.md).
)";

}  // namespace ddp::launcher
