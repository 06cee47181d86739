// ddp-bench: one side of the ddp vs Python DDP benchmark (see
// BENCHMARKS.md and bench/run.py, which drives it).
//
//   ddprun --standalone --nproc-per-node 2 ddp-bench --workload mlp \
//       --side ddp --weights /tmp/w/mlp --out-json /tmp/r.json
//   ddp-bench --workload mlp --save-weights /tmp/w/mlp   # initial weights
//
// Rank 0 writes the result (JSON, bench_run.h) to --out-json, or prints it.
#include <CLI/CLI.hpp>
#include <ATen/Context.h>

#include <iostream>

#include "bench_run.h"
#include "ddp/error.h"
#include "model.h"
#include "models.h"
#include "weights.h"

namespace {

void add_flags(CLI::App& app, ddp::bench::RunConfig& c) {
  app.add_option("--workload", c.workload, "mlp, cnn or transformer")->capture_default_str();
  app.add_option("--side", c.side, "ddp (DistributedDataParallel) or plain (no DDP, W=1)")
      ->capture_default_str();
  app.add_option("--mode", c.mode, "train, or sync (gradient synchronisation alone)")
      ->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps before them")->capture_default_str();
  app.add_option("--batch", c.batch, "Per-rank batch; default: the workload's");
  app.add_flag("--tiny", c.tiny, "Tiny model sizes (smoke test)");
  app.add_option("--seed", c.seed, "Seed of the synthetic data")->capture_default_str();
  app.add_option("--pool", c.pool, "Distinct synthetic batches, cycled")->capture_default_str();
  app.add_option("--weights", c.weights, "Load initial weights from PREFIX.json/.bin");
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd (with --momentum) or adam (--lr)")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_flag("--zero", c.zero, "Shard the optimizer state: ddp::ZeroRedundancyOptimizer");
  app.add_flag("--fully-shard", c.fully_shard,
               "ddp::fully_shard instead of DDP: parameters, gradients and optimizer state "
               "sharded (mlp: one unit; transformer: a unit per encoder layer)");
  app.add_flag("--fsdp-no-prefetch{false}", c.fsdp_prefetch,
               "--fully-shard without prefetching the next unit's all-gather");
  app.add_option("--fsdp-param-dtype", c.fsdp_param_dtype,
                 "--fully-shard with MixedPrecisionPolicy: bf16 (param_dtype bfloat16, "
                 "reduce_dtype and output_dtype float32)")
      ->check(CLI::IsMember({"", "bf16"}));
  app.add_option("--threads", c.threads, "Torch intra-op threads")->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP bucket_cap_mb")->capture_default_str();
  app.add_option("--first-bucket-cap-mb", c.first_bucket_cap_mb, "DDP first bucket, MiB")
      ->capture_default_str();
  app.add_option("--comm-hook", c.comm_hook,
                 "none, allreduce, fp16, bf16, powersgd-R or batched-powersgd-R (R: rank)")
      ->capture_default_str();
  app.add_flag("--find-unused-parameters", c.find_unused_parameters,
               "DDP find_unused_parameters");
  app.add_flag("--static-graph", c.static_graph, "DDP static_graph");
  app.add_flag("--gradient-as-bucket-view", c.gradient_as_bucket_view,
               "DDP gradient_as_bucket_view");
  app.add_option("--broadcast-buffers", c.broadcast_buffers, "DDP broadcast_buffers (0/1)")
      ->capture_default_str();
  app.add_option("--gloo-threads", c.gloo_threads, "Gloo worker threads")->capture_default_str();
  app.add_option("--amp", c.amp, "Mixed precision: none, bf16 (autocast) or fp16 (autocast + GradScaler)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, or cuda (cuda:LOCAL_RANK)")->capture_default_str();
  app.add_option("--backend", c.backend, "gloo or nccl")->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp-bench: ddp's side of the ddp vs Python DDP benchmark"};
  ddp::bench::RunConfig config;
  std::string out_json, save_weights;
  add_flags(app, config);
  app.add_option("--out-json", out_json, "Rank 0 writes its result here (else stdout)");
  app.add_option("--save-weights", save_weights,
                 "Write the workload's seeded initial weights to PREFIX.json/.bin and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!save_weights.empty()) {
      auto s = ddp::bench::workload_shape(config.workload, config.tiny, config.batch);
      at::manual_seed(config.seed);
      std::shared_ptr<torch::nn::Module> m;
      if (s.name == "mlp") m = ddp::bench::Mlp(s).ptr();
      if (s.name == "cnn") m = ddp::train::FashionCnn().ptr();
      if (s.name == "transformer") m = ddp::bench::TransformerNet(s).ptr();
      ddp::bench::save_weights(*m, save_weights);
      return 0;
    }
    nlohmann::json result = ddp::bench::run_benchmark(config);
    if (result.empty()) return 0;  // not rank 0
    result["command"] = std::vector<std::string>(argv, argv + argc);
    if (out_json.empty()) {
      std::cout << result.dump() << std::endl;
    } else {
      ddp::bench::write_atomically(out_json, result.dump(1) + "\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp-bench: " << e.what() << std::endl;
    return 1;
  }
}
