// Process groups: who takes part in collectives, over which backend.
//
// Follows torch.distributed: init_process_group() creates the default group
// from an init method, collectives (collectives.h) run on it unless told
// otherwise, destroy_process_group() tears it down. Backends are Gloo (CPU
// tensors; also CUDA tensors where libtorch has CUDA) and NCCL where libtorch
// was built with it.
//
// Typical use, under ddprun / torchrun / srun / mpirun:
//
//   ddp::init_process_group();                 // env://, gloo
//   c10::Device device = ddp::local_device();   // cuda:<local_rank> on GPUs
//   ...
//   ddp::destroy_process_group();
//
// Thread safety: a ProcessGroup may be used from several threads, but the
// collectives of one group must be issued in the same order on every rank
// (as in PyTorch); issuing them concurrently from several threads of one
// rank makes that order undefined. init/destroy of the default group must not
// race with its use.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ddp/env.h"

namespace ddp {

namespace detail {
struct ProcessGroupImpl;
}

// PyTorch's default for both rendezvous and collectives (30 minutes).
inline constexpr std::chrono::milliseconds kDefaultTimeout{30 * 60 * 1000};

struct InitOptions {
  // "gloo" or "nccl". "nccl" needs a libtorch built with CUDA and NCCL and
  // a visible CUDA device; otherwise init throws CommError saying so.
  std::string backend = "gloo";
  // NCCL: the CUDA device of this rank (PyTorch's init_process_group
  // device_id). Unset: local_device(), i.e. cuda:LOCAL_RANK. CPU tensors
  // given to a NCCL group's collectives travel through it (collectives.h).
  // Ignored by Gloo.
  std::optional<c10::Device> device_id;
  // Where ranks meet:
  //   "env://"            MASTER_ADDR/MASTER_PORT and the rank variables of
  //                       env.h (torchrun, SLURM, Open MPI); rank 0 hosts a
  //                       TCP store there. When DDP_RENDEZVOUS_FILE is set
  //                       (ddprun --standalone sets it), the ranks meet in
  //                       that file instead and nothing listens on the
  //                       network. A world of one (no rank variables, or
  //                       WORLD_SIZE=1) uses an in-process store: no port;
  //   "tcp://host:port"   rank 0 hosts the store on port; rank and
  //                       world_size below must be set;
  //   "file:///abs/path"  a file on a shared file system; rank and world_size
  //                       must be set; the file must not be left over from a
  //                       previous job;
  //   "memory://name"     an in-process store for ranks run as threads of one
  //                       process (tests); rank and world_size must be set.
  std::string init_method = "env://";
  int rank = -1;        // -1: from the environment (env:// only)
  int world_size = -1;  // -1: from the environment (env:// only)
  // Bound on the rendezvous and on every collective of the group unless a
  // call gives its own (collectives.h). Must be > 0.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Namespace of the group's keys in the store; groups sharing one store
  // need distinct names.
  std::string group_name = "default";
  // Gloo: number of worker threads that run collectives (PyTorch: 2).
  int gloo_threads = 2;
  // Stall inspector: a collective that has waited this long logs, on every
  // waiting rank, which ranks have not reached it and what each was last
  // doing (step, sequence number, operation). The rendezvous reports at the
  // same interval while a rank waits there: "rank 0 is waiting for 1 of 2
  // ranks (rank 1) at HOST:PORT for 60 s" (or, before rank 0's store is up,
  // for that store). Env DDP_STALL_WARNING_S overrides it. Must be > 0.
  std::chrono::milliseconds stall_warning{60 * 1000};
  // Debug mode: before every collective, check that all ranks issue the
  // same operation with the same shapes and dtypes, and throw MismatchError
  // on every rank naming the first rank that differs. A few store round
  // trips per collective. Also enabled by DDP_DEBUG=1 or
  // TORCH_DISTRIBUTED_DEBUG=DETAIL.
  bool debug_collectives = false;
  // Gloo: the local address the transport binds. Empty: GLOO_SOCKET_IFNAME
  // if set (an interface name, as in PyTorch), else the local address that
  // routes to MASTER_ADDR (127.0.0.1 for a loopback master).
  std::string gloo_address;
  // Gloo backend, CPU tensors: ranks that share a host all_reduce through
  // shared memory instead of Gloo's loopback TCP (ranks on other hosts: a
  // shared-memory reduce on each host, Gloo among the hosts' lowest ranks,
  // a shared-memory broadcast back). Results equal Gloo's within float
  // rounding and are bitwise identical on every rank. false, or DDP_SHM=0 in
  // the environment, turns it off. Where /dev/shm cannot be used (missing,
  // too small: Docker's default 64 MiB), every rank falls back to Gloo and
  // rank 0 logs one warning naming the reason. See
  // ProcessGroup::shared_memory_ranks() and docs/shared_memory.md.
  bool shared_memory = true;
  // Bytes of each rank's shared staging buffer (larger all_reduces go in
  // chunks); 0: 32 MiB, less when /dev/shm is small.
  size_t shared_memory_staging_bytes = 0;
};

// A set of ranks and a communication backend. Created by init_process_group()
// (the default group) or new_process_group(); shared by every user through
// std::shared_ptr; the backend and its store are released with the last
// reference. Not copyable.
class ProcessGroup {
 public:
  explicit ProcessGroup(std::unique_ptr<detail::ProcessGroupImpl> impl);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;                         // in [0, size())
  int size() const;                         // world size of the group
  const std::string& backend() const;       // "gloo" or "nccl"
  std::chrono::milliseconds timeout() const;
  // Address of the rendezvous, for messages ("127.0.0.1:29500", a path...).
  const std::string& address() const;
  // Ranks of this host whose all_reduce goes through shared memory
  // (including this one), or 0 when this group uses Gloo alone; and why it
  // does ("" when shared memory is on or no two ranks share a host).
  int shared_memory_ranks() const;
  const std::string& shared_memory_off_reason() const;
  // NCCL: the rank's CUDA device (InitOptions::device_id); Gloo: cpu.
  c10::Device device() const;

  // Implementation access for ddp's own code (collectives, the reducer).
  detail::ProcessGroupImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::ProcessGroupImpl> impl_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Note [Null process group]
// Every option that names a group (CollectiveOptions::group as PyTorch's
// collectives' `group=`; `process_group` in the options of
// DistributedDataParallel, ZeroRedundancyOptimizer, SyncBatchNorm and
// checkpoints, as PyTorch's) takes null to mean the calling thread's default
// group (default_group()), looked up when the call runs (by the objects
// that hold a group, DistributedDataParallel and ZeroRedundancyOptimizer, at
// their construction; by SyncBatchNorm at each forward). When there is no
// default group, what PyTorch does is done: the communication calls
// themselves (collectives.h, metrics.h, DistributedDataParallel) throw
// InvalidArgument ("call ddp::init_process_group() first"), while the
// objects that are useful in one process work as a world of one:
// SyncBatchNorm is plain BatchNorm, ZeroRedundancyOptimizer keeps the whole
// state, checkpoints are written and read without communication.

// Creates a process group and rendezvouses with the other ranks: returns once
// all world_size ranks have arrived. Does not touch the default group.
// Throws:
//   InvalidArgument  unknown backend or init method, rank/world_size missing
//                    or out of range (naming the variable), an invalid
//                    address or port, two processes claiming the same rank;
//   CommError        the backend is not compiled into libtorch, the port is
//                    in use (naming it), a transport failure;
//   TimeoutError     not every rank arrived within options.timeout; the
//                    message names how many arrived, which ranks are
//                    missing, and the address.
ProcessGroupPtr new_process_group(const InitOptions& options = {});

// new_process_group() installed as the default group of the process.
// Throws as new_process_group(); InvalidArgument if a default group exists.
ProcessGroupPtr init_process_group(const InitOptions& options = {});

// Whether init_process_group() has been called (and not destroyed).
bool is_initialized();

// Releases the default group (the backend goes when its last user lets go).
// No-op when there is none.
void destroy_process_group();

// The default group for the calling thread: a DefaultGroupGuard's group if
// one is active on this thread, else the process's default group.
// Throws InvalidArgument("... call ddp::init_process_group() first") when
// there is none.
ProcessGroupPtr default_group();

// Rank and size in the default group. Without a group, PyTorch raises; we do
// too (InvalidArgument), except is_main_process() which is true then.
int get_rank();
int get_world_size();
// LOCAL_RANK of the launch environment (0 when not launched by a launcher).
int get_local_rank();
// The device this process trains on, as the Python recipe picks it
// (torch.device("cuda", local_rank) when CUDA is available): cuda:LOCAL_RANK
// when this libtorch has CUDA and a GPU is visible, else cpu. Under
// `ddprun --nproc-per-node gpu` each local rank gets its own GPU; with
// CUDA_VISIBLE_DEVICES set per process (ddprun --virtual-local-rank), every
// process sees its one GPU as cuda:0 and LOCAL_RANK is 0. Throws
// InvalidArgument when LOCAL_RANK names a GPU that does not exist (more
// processes than visible GPUs), naming both numbers.
c10::Device local_device();
// True on rank 0 of the default group, or when no group exists.
bool is_main_process();

// Makes `group` the default group of the calling thread for the guard's
// lifetime. This is how one process runs several ranks as threads (tests,
// simulations): each thread installs its own group, and every ddp call
// without an explicit group uses it. Guards nest.
class DefaultGroupGuard {
 public:
  explicit DefaultGroupGuard(ProcessGroupPtr group);
  ~DefaultGroupGuard();
  DefaultGroupGuard(const DefaultGroupGuard&) = delete;
  DefaultGroupGuard& operator=(const DefaultGroupGuard&) = delete;

 private:
  ProcessGroupPtr previous_;
};

}  // namespace ddp
