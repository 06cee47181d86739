// allreduce-bench: the raw bandwidth of one all_reduce of a flat float32
// tensor, the ceiling for DDP's gradient synchronisation of the same bytes.
// Each iteration: barrier, then time one ddp::all_reduce (SUM) of the tensor.
//
//   ddprun --standalone --nproc-per-node 2 allreduce-bench --bytes 7454760
//
// Rank 0 writes {"bytes", "time_s": {median, p10, p90, ...},
// "bandwidth_gb_s" (bytes / median time), "copy_s" (one copy of the same
// bytes, all ranks copying at once, for reference), "path" (shared-memory or
// the backend), ...} to --out-json or stdout. bench/allreduce_sweep.py runs
// it over sizes and world sizes, shared memory against Gloo.
#include <CLI/CLI.hpp>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>

#include <torch/cuda.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "bench_run.h"
#include "ddp/collectives.h"
#include "ddp/process_group.h"
#include "weights.h"

int main(int argc, char** argv) {
  CLI::App app{"allreduce-bench: raw all_reduce bandwidth of one flat float32 tensor"};
  int64_t bytes = 4 << 20;
  int iters = 30, warmup = 5, gloo_threads = 2, batch = 1;
  std::string out_json, device = "cpu", backend = "gloo";
  app.add_option("--bytes", bytes, "Tensor size in bytes (rounded down to floats)")
      ->capture_default_str();
  app.add_option("--iters", iters, "Timed all_reduces")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed all_reduces first")->capture_default_str();
  app.add_option("--gloo-threads", gloo_threads, "Gloo worker threads")->capture_default_str();
  app.add_option("--batch", batch,
                 "All_reduces back to back per timed sample (time per all_reduce reported): "
                 "1 measures one collective after a barrier (its latency, with the ranks' "
                 "skew), more the steady rate, as DDP's buckets issue them")
      ->capture_default_str();
  app.add_option("--out-json", out_json, "Rank 0 writes its result here (else stdout)");
  app.add_option("--device", device, "cpu, or cuda (cuda:LOCAL_RANK)")->capture_default_str();
  app.add_option("--backend", backend, "gloo or nccl")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    ddp::InitOptions init;
    init.gloo_threads = gloo_threads;
    init.backend = backend;
    ddp::init_process_group(init);
    const char* local = std::getenv("LOCAL_RANK");
    const c10::Device dev = device == "cpu" ? c10::Device(c10::kCPU)
                                            : c10::Device(c10::kCUDA, local ? std::atoi(local) : 0);
    at::Tensor t = at::ones({std::max<int64_t>(bytes / 4, 1)}, at::TensorOptions().device(dev));
    std::vector<double> times;
    for (int i = 0; i < warmup + iters; ++i) {
      ddp::barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batch; ++b) ddp::all_reduce(t);
      if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) times.push_back(s / batch);
    }
    // Reference: one local copy of the same bytes on every rank at once
    // (after a barrier, so the ranks share the memory bus as they do in an
    // all_reduce): what a shared-memory transport moves per rank, at least.
    at::Tensor dst = at::empty_like(t);
    std::vector<double> copies;
    for (int i = 0; i < warmup + iters; ++i) {
      ddp::barrier();
      auto t0 = std::chrono::steady_clock::now();
      dst.copy_(t);
      if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) copies.push_back(s);
    }
    const int rank = ddp::get_rank(), world = ddp::get_world_size();
    const int shm_ranks = ddp::default_group()->shared_memory_ranks();
    ddp::destroy_process_group();
    if (rank != 0) return 0;
    nlohmann::json out{{"impl", "ddp-cpp"}, {"mode", "allreduce"}, {"world_size", world},
                       {"bytes", t.numel() * 4}, {"gloo_threads", gloo_threads},
                       {"batch", batch},
                       {"device", device}, {"backend", backend},
                       {"path", shm_ranks > 0 ? "shared-memory" : backend},
                       {"time_s", ddp::bench::summarize(times)},
                       {"copy_s", ddp::bench::summarize(copies)}};
    out["bandwidth_gb_s"] = t.numel() * 4 / out["time_s"]["median"].get<double>() / 1e9;
    out["command"] = std::vector<std::string>(argv, argv + argc);
    if (out_json.empty()) {
      std::cout << out.dump() << std::endl;
    } else {
      ddp::bench::write_atomically(out_json, out.dump(1) + "\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "allreduce-bench: " << e.what() << std::endl;
    return 1;
  }
}
