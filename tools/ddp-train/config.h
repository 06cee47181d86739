// ddp-train's configuration: its flags, parsed with CLI11.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/error.h"

namespace ddp::train {

struct TrainConfig {
  int epochs = 7;
  int64_t batch_size = 64;     // per process; the global batch is x world size
  double lr = 0.006;           // the peak with --schedule onecycle; before --scale-lr
  bool scale_lr = false;       // lr x world size (linear scaling rule)
  std::string optimizer = "adam";  // "adam" or "sgd" (momentum 0.9)
  // "onecycle" (PyTorch's OneCycleLR: lr rises from lr/25 to lr over the
  // first 30 % of the steps, then falls to lr/25e4, both cosine) or
  // "constant".
  std::string schedule = "onecycle";
  uint64_t seed = 0;
  // Training batches transformed at random (augment.h): none, flip, or
  // flip-shift.
  std::string augment = "none";
  // Cross-entropy's label_smoothing (PyTorch's): the target puts this much
  // of its weight evenly over all classes. 0: plain cross-entropy. 0.1 by
  // default: with 7 epochs, 92.41 % test accuracy (README, "Measured").
  double label_smoothing = 0.1;
  // Mixed precision (docs/mixed_precision.md): "none", "bf16" (the forward
  // under autocast in bfloat16) or "fp16" (float16, with a GradScaler whose
  // state the checkpoints keep).
  std::string amp = "none";
  std::string backend = "gloo";
  std::string device = "cpu";  // "cpu" or "cuda" (cuda:LOCAL_RANK)
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int workers = 1;             // loader threads per process (num_workers)
  std::string out_dir = "ddp-train-out";  // metrics.jsonl, plot, checkpoints
  std::string checkpoint_dir;  // default: <out_dir>/checkpoints
  bool resume = false;
  // Replace the run --out-dir holds (its metrics, plot and checkpoints)
  // instead of refusing it (Note [One run per directory]).
  bool overwrite = false;
  // -1 ("all", the flags' absence): no limit; else >= 1.
  int64_t max_steps = -1;      // stop after this many optimizer steps
  int64_t train_samples = -1;  // use the first N training images (tests)
  int64_t test_samples = -1;   // use the first N test images (tests)
  bool find_unused_parameters = false;
  // --comm-hook: none, allreduce, fp16, bf16, powersgd-1, powersgd-2, powersgd-4
  std::string comm_hook = "none";
  bool static_graph = false;
  bool sync_bn = false;        // ddp::SyncBatchNorm instead of BatchNorm2d
  // ddp::fully_shard instead of DistributedDataParallel: conv1, conv2, fc1
  // and fc2 are units, the CNN the root (docs/fully_shard.md). Excludes
  // --comm-hook, --static-graph and --find-unused-parameters (DDP's).
  bool fully_shard = false;
  int log_every = 50;          // steps between progress lines (not a tty)
  double timeout_s = 600;      // bound on every collective
  int threads = 0;             // torch intra-op threads; 0: OMP_NUM_THREADS or 1
  bool no_plot = false;
  // Fault injection, for testing failure handling: at optimizer step
  // fault_step (1-based) on rank fault_rank, in launcher attempt
  // fault_attempt (TORCHELASTIC_RESTART_COUNT; -1: every attempt):
  // "crash-in-backward" (abort() inside backward), "sigkill", "sigstop",
  // "exit" (exit code 3), "skip-collective" (every other rank calls
  // barrier(), this one skips it: the flight recorder's test).
  std::string fault;
  int fault_rank = 1;
  int64_t fault_step = 3;
  int fault_attempt = 0;
};

// A bad command line: its what() is the whole line to print ("ddp-train:
// error: unknown flag --epoch (did you mean --epochs?) (see ddp-train
// --help)"); main() exits 2 with it.
struct UsageError : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

// Parses argv (also accepts --local_rank=N / --local-rank N from
// torch.distributed.launch). Prints help and exits 0 for --help; throws
// UsageError naming the flag for an unknown flag or a bad value.
TrainConfig parse_args(int argc, char** argv);

// One line describing the run, for logs.
std::string describe(const TrainConfig& config, int world_size);

}  // namespace ddp::train
