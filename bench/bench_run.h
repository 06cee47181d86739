// One benchmark run of ddp-bench (one process = one rank).
//
// mode "train": `warmup` untimed steps, then `steps` timed steps of
//   zero_grad, forward, cross-entropy loss, backward, SGD(momentum) step,
//   cycling through a pool of synthetic batches. side "ddp" wraps the model
//   in ddp::DistributedDataParallel; side "plain" is the bare libtorch loop,
//   the floor for DDP's overhead. At world size W > 1 (under ddprun) plain
//   runs W independent loops, the process group used only for the barriers
//   around the timed steps: W x B samples per step with no communication,
//   the ceiling of any data-parallel implementation on the machine.
// mode "sync": the cost of gradient synchronisation alone. The loss is the
//   sum of all parameters' sums, so backward computes next to nothing and
//   every gradient is ready at once; each iteration times (after a barrier)
//   forward+backward of a plain copy of the model, then of the DDP-wrapped
//   model. sync_s = median(ddp) - median(plain) is the time DDP adds: bucket
//   copies, the all_reduces, copying back.
//
// Rank 0 returns the result as JSON (other ranks return an empty object).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ddp::bench {

struct RunConfig {
  std::string workload = "mlp";    // mlp | cnn | transformer (models.h)
  std::string side = "ddp";        // ddp | plain
  std::string mode = "train";      // train | sync
  int steps = 50;                  // timed steps (iterations in sync mode)
  int warmup = 10;                 // untimed steps first
  int64_t batch = -1;              // per rank; <= 0: the workload's default
  bool tiny = false;               // smoke-test sizes
  uint64_t seed = 0;
  int pool = 4;                    // distinct synthetic batches, cycled
  std::string weights;             // prefix of weights.h files; empty: seeded init
  double lr = 0.01, momentum = 0.9;
  std::string optimizer = "sgd";   // sgd (with momentum) | adam
  bool zero = false;               // ZeroRedundancyOptimizer around it (ddp side)
  bool fully_shard = false;        // ddp::fully_shard instead of DDP (ddp side; mlp,
                                   // transformer: models.h's Sharded* variants)
  bool fsdp_prefetch = true;       // FullyShardOptions::prefetch
  // "" or "bf16": MixedPrecisionPolicy{param_dtype bf16, reduce_dtype and
  // output_dtype float32} on every unit.
  std::string fsdp_param_dtype;
  int threads = 1;                 // torch intra-op threads
  // "cpu", or "cuda": each rank uses cuda:LOCAL_RANK (the GPU script,
  // bench/gpu/run.sh); CUDA work is synchronised at the end of every step.
  std::string device = "cpu";
  std::string backend = "gloo";    // gloo | nccl
  // DistributedDataParallelOptions and the process group.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool gradient_as_bucket_view = false;
  // none (the built-in all_reduce), allreduce, fp16, bf16, or powersgd-R
  // (PowerSGD rank R from iteration 2; batched-powersgd-R the batched hook).
  std::string comm_hook = "none";
  bool find_unused_parameters = false;
  bool static_graph = false;
  bool broadcast_buffers = true;
  int gloo_threads = 2;
  // Mixed precision of the train loop: none, bf16 (forward and loss under
  // ddp::AutocastGuard), or fp16 (the same, with a ddp::GradScaler), as
  // bench/python_ddp.py --amp does with torch.autocast and GradScaler.
  std::string amp = "none";
};

// Runs the benchmark. Initialises the default process group from the
// environment (ddprun) for side ddp, and destroys it at the end. Throws
// ddp::InvalidArgument for bad settings (naming the flag), and whatever the
// collectives throw.
nlohmann::json run_benchmark(const RunConfig& config);

// Median and percentiles of a sample, in the sample's unit. Empty -> zeros.
nlohmann::json summarize(std::vector<double> values);

}  // namespace ddp::bench
