// ddp: DistributedDataParallel for the PyTorch C++ API. The umbrella header:
// includes the distributed API, the headers listed here except datasets/.
// Include the individual headers instead to keep compile times down (each
// is self-contained).
//
//   process_group.h             init_process_group, ranks, default group
//   env.h                       launch environment (torchrun, SLURM, MPI)
//   collectives.h               all_reduce, broadcast, all_gather, ...
//   collectives_sharding.h      reduce_scatter_tensor, all_gather_into_tensor,
//                               all_to_all_single, all_to_all
//   point_to_point.h            send, recv, isend, irecv, batch_isend_irecv
//   subgroup.h                  new_group(ranks)
//   distributed_sampler.h       DistributedSampler (PyTorch's indices)
//   distributed_data_parallel.h DistributedDataParallel, no_sync, stats
//   comm_hooks.h                comm hooks (fp16/bf16 compression, your own)
//   powersgd.h                  PowerSGD compression hooks
//   join.h                      uneven inputs (Join)
//   metrics.h                   metrics reduced over ranks
//   logging.h                   rank-0 / rank-prefixed logging
//   checkpoint.h                atomic rank-0 checkpoints
//   error.h                     the error types and policy
//   flight_recorder.h           which rank stopped where (ddp-trace)
//   sync_batchnorm.h            SyncBatchNorm, convert_sync_batchnorm
//   zero_redundancy_optimizer.h ZeroRedundancyOptimizer
//   fully_shard.h               fully_shard (FSDP2), FullyShard<Impl> units
//   mixed_precision_policy.h    MixedPrecisionPolicy (fully_shard's, FSDP2's)
//   sharded_checkpoint.h        per-rank checkpoints of fully_shard models
//   optimizer_state.h           OptimizerState, the ShardedOptimizer interface
//   grad_scaler.h               GradScaler (float16 loss scaling)
//   state_dict.h                Python's torch.save'd state dicts, both ways
//   autocast.h                  AutocastGuard (torch.autocast as a scope)
//
// Not included: datasets/ (IDX files, Fashion-MNIST, the prefetching batch
// loader, per-batch seeding), the data side of ddp-train, which a program
// with its own data does not need; include ddp/datasets/<name>.h and link
// the library ddp::datasets (find_package(ddp) brings it). They are
// cheap (ATen's core headers), except datasets/torch_adapter.h: it pulls in
// libtorch's torch/data, about 30 s more per translation unit.
#pragma once

#include "ddp/autocast.h"
#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/collectives_sharding.h"
#include "ddp/point_to_point.h"
#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/flight_recorder.h"
#include "ddp/fully_shard.h"
#include "ddp/sharded_checkpoint.h"
#include "ddp/grad_scaler.h"
#include "ddp/join.h"
#include "ddp/logging.h"
#include "ddp/metrics.h"
#include "ddp/optimizer_state.h"
#include "ddp/powersgd.h"
#include "ddp/process_group.h"
#include "ddp/state_dict.h"
#include "ddp/subgroup.h"
#include "ddp/sync_batchnorm.h"
#include "ddp/zero_redundancy_optimizer.h"
