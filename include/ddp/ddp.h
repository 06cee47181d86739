// ddp: DistributedDataParallel for the PyTorch C++ API. The umbrella header:
// includes the whole public API. Include the individual headers instead to
// keep compile times down (each is self-contained).
//
//   process_group.h             init_process_group, ranks, default group
//   env.h                       launch environment (torchrun, SLURM, MPI)
//   collectives.h               all_reduce, broadcast, all_gather, ...
//   distributed_sampler.h       DistributedSampler (PyTorch's indices)
//   distributed_data_parallel.h DistributedDataParallel, no_sync, stats
//   join.h                      uneven inputs (Join)
//   metrics.h                   metrics reduced over ranks
//   logging.h                   rank-0 / rank-prefixed logging
//   checkpoint.h                atomic rank-0 checkpoints
//   datasets/                   IDX files, Fashion-MNIST, batch loader
//   error.h                     the error types and policy
#pragma once

#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp/logging.h"
#include "ddp/metrics.h"
#include "ddp/process_group.h"
