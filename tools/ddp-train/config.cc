#include "config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "cli/usage_error.h"
#include "ddp/env.h"
#include "ddp/error.h"

namespace ddp::train {
namespace {

// Validators with one-line errors ("--epochs: must be an integer >= 1, got
// 0"); CLI11's own range checks print the type's limits, 310 digits for a
// double. Each validates and, where it must, rewrites the text in one step
// (CLI11 runs transforms before checks).
CLI::Validator integer_in(long long min, long long max, const std::string& name) {
  return CLI::Validator(
      [min, max](std::string& s) -> std::string {
        long long v = 0;
        if (!CLI::detail::lexical_cast(s, v) || v < min || v > max) {
          return max == std::numeric_limits<long long>::max()
                     ? fmt::format("must be an integer >= {}, got {}", min, s)
                     : fmt::format("must be an integer from {} to {}, got {}", min, max, s);
        }
        return "";
      },
      name);
}

// For an int field: at most INT_MAX.
CLI::Validator integer_at_least(long long min) {
  return integer_in(min, std::numeric_limits<int>::max(), fmt::format("INT >= {}", min));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !(v > 0) || !std::isfinite(v)) {
          return fmt::format("must be a finite number > 0, got {}", s);
        }
        return "";
      },
      "NUMBER > 0");
}

// A number in [0, 1): a probability that must leave the target some weight.
CLI::Validator fraction_below_one() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !(v >= 0 && v < 1)) {
          return fmt::format("must be a number in [0, 1), got {}", s);
        }
        return "";
      },
      "NUMBER in [0, 1)");
}

// "all" (stored as -1, the default) or a count >= 1.
void add_count(CLI::App& app, const std::string& flag, int64_t& value, const std::string& help) {
  app.add_option(flag, value, help + " (a count >= 1, or all)")
      ->default_str("all")
      ->transform(CLI::Validator(
          [](std::string& s) -> std::string {
            long long v = 0;
            if (s == "all") {
              s = "-1";
              return "";
            }
            if (!CLI::detail::lexical_cast(s, v) || v < 1) {
              return fmt::format("must be a count >= 1 or all, got {}", s);
            }
            return "";
          },
          "INT >= 1 or all"));
}

}  // namespace

TrainConfig parse_args(int argc, char** argv) {
  ddp::local_rank_from_argv(argc, argv);  // the rank comes from the environment
  TrainConfig c;
  CLI::App app{
      "ddp-train: data-parallel training of a CNN on Fashion-MNIST.\n"
      "Run it under a launcher, e.g.: ddprun --standalone --nproc-per-node 2 ddp-train"};
  // A flag given twice: the last value wins, as in most command lines.
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--epochs", c.epochs, "Training epochs")->check(integer_at_least(1));
  app.add_option("--batch-size", c.batch_size,
                 "Batch size per process (global batch = this x world size)")
      ->check(integer_at_least(1));
  app.add_option("--lr", c.lr, "Learning rate: the peak of --schedule onecycle (before --scale-lr)")
      ->check(positive_number());
  app.add_option("--schedule", c.schedule,
                 "onecycle (lr/25 up to lr in the first 30% of the steps, then down to lr/25e4, "
                 "cosine: PyTorch's OneCycleLR) or constant")
      ->check(CLI::IsMember({"onecycle", "constant"}));
  app.add_flag("--scale-lr", c.scale_lr, "Multiply the learning rate by the world size");
  app.add_option("--optimizer", c.optimizer, "adam or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--augment", c.augment,
                 "Random transformations of the training images: none, flip (mirrored with "
                 "probability 1/2) or flip-shift (then shifted by up to 2 pixels)")
      ->check(CLI::IsMember({"none", "flip", "flip-shift"}));
  app.add_option("--label-smoothing", c.label_smoothing,
                 "Cross-entropy's label smoothing, in [0, 1) (PyTorch's label_smoothing)")
      ->check(fraction_below_one());
  app.add_option("--amp", c.amp,
                 "Mixed precision: none, bf16 (forward and loss under autocast in bfloat16) or "
                 "fp16 (float16, with a GradScaler)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_option("--seed", c.seed, "Seed for weights, dropout, the sampler's shuffling and "
                                   "the augmentation")
      ->check(integer_in(0, std::numeric_limits<long long>::max(), "INT >= 0"));
  app.add_option("--backend", c.backend, "gloo or nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--device", c.device, "cpu, or cuda (uses cuda:LOCAL_RANK)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--data-dir", c.data_dir, "Directory with the Fashion-MNIST *-ubyte.gz files");
  app.add_option("--workers", c.workers, "Loader threads per process (num_workers)")
      ->check(integer_at_least(0));
  app.add_option("--out-dir", c.out_dir, "Where rank 0 writes metrics.jsonl and the plot");
  app.add_option("--checkpoint-dir", c.checkpoint_dir,
                 "Checkpoints, one per epoch, the last 3 kept (default: <out-dir>/checkpoints)");
  auto* resume = app.add_flag("--resume", c.resume,
                              "Continue the run in --out-dir from its latest checkpoint, if any "
                              "(with that run's flags: they are checked)");
  app.add_flag("--overwrite", c.overwrite,
               "Replace the run in --out-dir (its metrics, plot and checkpoints) instead of "
               "refusing a directory that holds one")
      ->excludes(resume);
  add_count(app, "--max-steps", c.max_steps, "Stop after this many optimizer steps");
  add_count(app, "--train-samples", c.train_samples, "Use only the first N training images");
  add_count(app, "--test-samples", c.test_samples, "Use only the first N test images");
  auto* unused = app.add_flag("--find-unused-parameters", c.find_unused_parameters,
                              "DistributedDataParallel's find_unused_parameters");
  auto* hook = app.add_option("--comm-hook", c.comm_hook,
                 "How gradient buckets are communicated: none (the built-in all_reduce), "
                 "allreduce, fp16, bf16 (PyTorch's allreduce_hook, fp16_compress_hook, "
                 "bf16_compress_hook), or powersgd-R (powerSGD_hook of rank R = 1, 2 or 4, "
                 "compressing from step 10); DDP's: not with --fully-shard")
      ->check(CLI::IsMember({"none", "allreduce", "fp16", "bf16", "powersgd-1", "powersgd-2",
                             "powersgd-4"}));
  auto* static_graph =
      app.add_flag("--static-graph", c.static_graph, "DistributedDataParallel's static_graph");
  app.add_flag("--fully-shard", c.fully_shard,
               "Fully sharded data parallel (ddp::fully_shard, PyTorch's FSDP2) instead of "
               "DistributedDataParallel: each rank keeps 1/world_size of the parameters, "
               "gradients and optimizer state; conv1, conv2, fc1 and fc2 are units. Not with "
               "DDP's --comm-hook, --static-graph or --find-unused-parameters")
      ->excludes(unused)
      ->excludes(static_graph);
  app.add_flag("--sync-bn", c.sync_bn,
               "SyncBatchNorm: BatchNorm statistics over every rank's batch, as one process "
               "with the global batch would compute them");
  app.add_option("--log-every", c.log_every, "Steps between progress lines when not a terminal")
      ->check(integer_at_least(1));
  app.add_option("--timeout", c.timeout_s, "Seconds any collective may wait")
      ->check(positive_number());
  app.add_option("--threads", c.threads, "Torch threads per process (0: OMP_NUM_THREADS or 1)")
      ->check(integer_at_least(0));
  app.add_flag("--no-plot", c.no_plot, "Do not draw metrics.png");
  auto* faults = app.add_option_group("Fault injection", "For testing failure handling");
  faults->add_option("--fault", c.fault,
                     "crash-in-backward, sigkill, sigstop, exit, or skip-collective (every other "
                     "rank calls barrier() at the step; this one skips it)")
      ->check(CLI::IsMember({"crash-in-backward", "sigkill", "sigstop", "exit", "skip-collective"}));
  faults->add_option("--fault-rank", c.fault_rank, "Rank that fails");
  faults->add_option("--fault-step", c.fault_step, "Optimizer step (1-based) at which it fails")
      ->check(integer_at_least(1));
  faults->add_option("--fault-attempt", c.fault_attempt,
                     "Launcher attempt (TORCHELASTIC_RESTART_COUNT) that fails; -1: every one");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    throw UsageError(cli::usage_error("ddp-train", app, e, std::vector<std::string>(argv + 1, argv + argc)));
  }
  if (c.fully_shard && c.comm_hook != "none") {
    throw UsageError(fmt::format(
        "ddp-train: error: --comm-hook {} is DistributedDataParallel's, and --fully-shard "
        "reduce-scatters gradients instead: drop one of the two flags (see ddp-train --help)",
        c.comm_hook));
  }
  if (c.checkpoint_dir.empty()) c.checkpoint_dir = c.out_dir + "/checkpoints";
  return c;
}

std::string describe(const TrainConfig& c, int world_size) {
  auto count = [](int64_t n, const char* one, const char* many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
  };
  return fmt::format(
      "ddp-train: world_size {}, batch {} per process ({} global), {} lr {}{} ({} schedule), {}, "
      "seed {}, backend {}, device {}, {}{}{}{}{}{}",
      world_size, c.batch_size, c.batch_size * world_size, c.optimizer,
      c.scale_lr ? c.lr * world_size : c.lr, c.scale_lr ? " (scaled)" : "", c.schedule,
      count(c.epochs, "epoch", "epochs"), c.seed, c.backend, c.device,
      count(c.workers, "loader thread", "loader threads"), c.sync_bn ? ", SyncBatchNorm" : "",
      c.augment == "none" ? "" : ", augment " + c.augment,
      c.label_smoothing > 0 ? fmt::format(", label smoothing {}", c.label_smoothing) : "",
      c.amp == "none" ? "" : ", amp " + c.amp, c.fully_shard ? ", fully_shard" : "");
}

}  // namespace ddp::train
