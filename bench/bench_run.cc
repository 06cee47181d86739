#include "bench_run.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "ddp/autocast.h"
#include "ddp/collectives.h"
#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "ddp/error.h"
#include "ddp/grad_scaler.h"
#include "ddp/process_group.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "model.h"  // tools/ddp-train: FashionCnn
#include "models.h"
#include "weights.h"

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Batches = std::vector<std::pair<at::Tensor, at::Tensor>>;
using nlohmann::json;

// CPU time of this process (all threads: compute, autograd, Gloo), seconds.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return tv(u.ru_utime) + tv(u.ru_stime);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Waits for queued CUDA work, so that wall times cover it.
void sync_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

c10::Device bench_device(const RunConfig& c) {
  if (c.device == "cpu") return c10::Device(c10::kCPU);
  const char* local = std::getenv("LOCAL_RANK");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local ? std::atoi(local) : 0));
}

// loss = sum of every parameter's sum: all gradients are ready at once and
// cost next to nothing, leaving DDP's gradient synchronisation to measure.
struct SyncProbeImpl : torch::nn::Module {
  explicit SyncProbeImpl(std::shared_ptr<torch::nn::Module> net) {
    register_module("net", std::move(net));
  }
  at::Tensor forward(const at::Tensor& /*unused*/) {
    at::Tensor total;
    for (const at::Tensor& p : parameters()) {
      total = total.defined() ? total + p.sum() : p.sum();
    }
    return total;
  }
};
TORCH_MODULE(SyncProbe);

// Calls fn(make) where make() builds a fresh model of the workload.
template <typename Fn>
json with_model(const WorkloadShape& s, Fn&& fn) {
  if (s.name == "mlp") return fn([&] { return Mlp(s); });
  if (s.name == "cnn") return fn([] { return train::FashionCnn(); });
  return fn([&] { return TransformerNet(s); });
}

DistributedDataParallelOptions ddp_options(const RunConfig& c, bool sync_mode) {
  DistributedDataParallelOptions o;
  if (c.device != "cpu") o.device_ids = {bench_device(c)};
  o.bucket_cap_mb = c.bucket_cap_mb;
  o.first_bucket_cap_mb = c.first_bucket_cap_mb;
  o.gradient_as_bucket_view = c.gradient_as_bucket_view;
  o.find_unused_parameters = c.find_unused_parameters;
  o.static_graph = c.static_graph;
  o.broadcast_buffers = c.broadcast_buffers && !sync_mode;
  return o;
}

// Registers c.comm_hook on `net`; returns the PowerSGD state, if any, for
// its compression statistics.
template <typename Net>
std::shared_ptr<PowerSGDState> register_hook(Net& net, const RunConfig& c) {
  const std::string& h = c.comm_hook;
  if (h == "none") return nullptr;
  if (h == "allreduce") net.register_comm_hook(allreduce_hook, h);
  else if (h == "fp16") net.register_comm_hook(fp16_compress_hook, h);
  else if (h == "bf16") net.register_comm_hook(bf16_compress_hook, h);
  else if (h.rfind("powersgd-", 0) == 0 || h.rfind("batched-powersgd-", 0) == 0) {
    PowerSGDOptions o;
    o.start_powerSGD_iter = 2;
    o.matrix_approximation_rank = std::stoi(h.substr(h.rfind('-') + 1));
    auto state = std::make_shared<PowerSGDState>(o);
    if (h[0] == 'b') net.register_comm_hook(state, batched_powerSGD_hook, h);
    else net.register_comm_hook(state, powerSGD_hook, h);
    return state;
  } else {
    throw InvalidArgument("ddp-bench: --comm-hook " + h + " is not one of none, allreduce, fp16, "
                          "bf16, powersgd-R, batched-powersgd-R");
  }
  return nullptr;
}

json stats_json(const DdpStats& s) {
  return {{"iterations", s.iterations},
          {"bucket_bytes", s.bucket_bytes},
          {"bucket_params", s.bucket_params},
          {"parameters", s.parameters},
          {"gradient_bytes", s.gradient_bytes},
          {"buckets_rebuilt", s.buckets_rebuilt},
          {"forward_s", s.forward_s},
          {"backward_compute_s", s.backward_compute_s},
          {"backward_comm_s", s.backward_comm_s},
          {"exposed_comm_s", s.exposed_comm_s},
          {"buffer_broadcast_s", s.buffer_broadcast_s}};
}

struct LoopResult {
  double elapsed_s = 0;
  double cpu_s = 0;  // this rank's CPU time over the timed steps
  std::vector<double> step_s;
  double final_loss = NAN;
};

template <typename Net>
LoopResult train_loop(Net& net, torch::optim::Optimizer& opt, const Batches& batches,
                      const RunConfig& c, bool distributed) {
  at::Tensor loss;
  const c10::Device device = bench_device(c);
  const bool autocast = c.amp != "none";
  const at::ScalarType amp_dtype = c.amp == "fp16" ? at::kHalf : at::kBFloat16;
  ddp::GradScaler scaler(ddp::GradScalerOptions{.enabled = c.amp == "fp16"});
  auto step = [&](int i) {
    const auto& b = batches[static_cast<size_t>(i) % batches.size()];
    opt.zero_grad();
    {
      ddp::AutocastGuard amp(device.type(), amp_dtype, autocast);
      loss = at::cross_entropy_loss(net(b.first), b.second);
    }
    scaler.scale(loss).backward();  // a pass-through unless fp16
    scaler.step(opt);
    scaler.update();
  };
  for (int i = 0; i < c.warmup; ++i) step(i);
  sync_device(device);
  if (distributed) barrier();
  LoopResult r;
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_s();
  for (int i = 0; i < c.steps; ++i) {
    const auto s0 = Clock::now();
    step(c.warmup + i);
    sync_device(device);
    r.step_s.push_back(seconds_since(s0));
  }
  r.cpu_s = process_cpu_s() - cpu0;
  if (distributed) barrier();
  r.elapsed_s = seconds_since(t0);
  if (loss.defined()) r.final_loss = loss.item<double>();
  return r;
}

template <typename M>
double eval_loss(M& model, const Batches& batches) {
  at::NoGradGuard no_grad;
  model->eval();
  double loss = at::cross_entropy_loss(model(batches[0].first), batches[0].second).template item<double>();
  model->train();
  return loss;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const RunConfig& c,
                                                       std::vector<at::Tensor> params) {
  auto sgd = torch::optim::SGDOptions(c.lr).momentum(c.momentum);
  auto adam = torch::optim::AdamOptions(c.lr);
  if (c.zero && c.optimizer == "adam") return std::make_unique<ZeroRedundancyOptimizer>(params, adam);
  if (c.zero) return std::make_unique<ZeroRedundancyOptimizer>(params, sgd);
  if (c.optimizer == "adam") return std::make_unique<torch::optim::Adam>(params, adam);
  return std::make_unique<torch::optim::SGD>(params, sgd);
}

// Bytes of a set of tensors (each once), e.g. parameters or their grads.
int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> g;
  for (const at::Tensor& p : params) g.push_back(p.grad());
  return g;
}

// Peak resident memory of this process so far, KiB.
int64_t max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Weights, device and this rank's batches for a training run; `out` gets
// the loss before training. Seeds dropout last, identically on both sides.
template <typename M>
Batches prepare_run(M& model, const WorkloadShape& s, const RunConfig& c, int rank, json& out) {
  if (!c.weights.empty()) load_weights(*model, c.weights);
  model->to(bench_device(c));
  Batches batches = make_batches(s, c.pool, c.seed * 1000 + rank);
  for (auto& b : batches) b = {b.first.to(bench_device(c)), b.second.to(bench_device(c))};
  out["eval_loss0"] = eval_loss(model, batches);
  at::manual_seed(c.seed * 1000 + 500 + rank);  // dropout
  return batches;
}

// Per-rank bytes and peak RSS (collectives: every rank is here).
void add_rank_memory(json& out, torch::optim::Optimizer& opt,
                     const std::vector<at::Tensor>& params) {
  out["max_rss_kib"] = all_gather_value(max_rss_kib());
  out["optimizer_state_bytes"] = all_gather_value(optimizer_state_bytes(opt));
  // After the last step: the gradients are still there (zero_grad comes
  // first in a step). DDP's buckets are in ddp_stats.bucket_bytes.
  out["param_bytes"] = all_gather_value(tensor_bytes(params));
  out["grad_bytes"] = all_gather_value(tensor_bytes(grads_of(params)));
}

void add_loop_result(json& out, const LoopResult& r, const WorkloadShape& s, const RunConfig& c,
                     int world) {
  out["elapsed_s"] = r.elapsed_s;
  out["samples_per_s"] = static_cast<double>(world) * s.batch * c.steps / r.elapsed_s;
  out["step_s"] = summarize(r.step_s);
  out["cpu_s_per_step"] = r.cpu_s / c.steps;
  out["final_loss"] = r.final_loss;
}

template <typename M>
json run_train(M model, const WorkloadShape& s, const RunConfig& c, int rank, int world) {
  json out;
  Batches batches = prepare_run(model, s, c, rank, out);
  LoopResult r;
  if (c.side == "plain") {
    auto opt = make_optimizer(c, model->parameters());
    r = train_loop(model, *opt, batches, c, /*distributed=*/world > 1);
    out["max_rss_kib"] = {max_rss_kib()};
    out["optimizer_state_bytes"] = {optimizer_state_bytes(*opt)};
    out["param_bytes"] = {tensor_bytes(model->parameters())};
    out["grad_bytes"] = {tensor_bytes(grads_of(model->parameters()))};
  } else {
    DistributedDataParallel<M> net(model, ddp_options(c, false));
    auto powersgd = register_hook(net, c);
    auto opt = make_optimizer(c, net.parameters());
    r = train_loop(net, *opt, batches, c, /*distributed=*/true);
    out["ddp_stats"] = stats_json(net.stats());
    add_rank_memory(out, *opt, net.parameters());
    if (powersgd) {
      auto cs = powersgd->compression_stats();
      int64_t compressed = std::max<int64_t>(
          0, powersgd->iteration() - powersgd->options().start_powerSGD_iter);
      out["powersgd"] = {{"numel_before", cs.numel_before}, {"numel_after", cs.numel_after},
                         {"rate", cs.rate}, {"compressed_iterations", compressed}};
    }
  }
  add_loop_result(out, r, s, c, world);
  return out;
}

// --fully-shard: the model sharded by ddp::fully_shard (models.h), an
// ordinary optimizer on the shards; bytes per rank as run_train's.
template <typename M>
json run_train_sharded(M model, const WorkloadShape& s, const RunConfig& c, int rank, int world) {
  json out;
  Batches batches = prepare_run(model, s, c, rank, out);
  FullyShardOptions options;
  options.prefetch = c.fsdp_prefetch;
  if (c.fsdp_param_dtype == "bf16") {
    options.mp_policy.param_dtype = at::kBFloat16;
    options.mp_policy.reduce_dtype = at::kFloat;
    options.mp_policy.output_dtype = at::kFloat;
  }
  shard_model(model, options);
  auto opt = make_optimizer(c, model->parameters());
  LoopResult r = train_loop(model, *opt, batches, c, /*distributed=*/true);
  add_rank_memory(out, *opt, model->parameters());
  add_loop_result(out, r, s, c, world);
  return out;
}

template <typename M>
json run_sync(M plain_model, M ddp_model, const RunConfig& c) {
  if (!c.weights.empty()) {
    load_weights(*plain_model, c.weights);
    load_weights(*ddp_model, c.weights);
  }
  const c10::Device device = bench_device(c);
  plain_model->to(device);
  ddp_model->to(device);
  SyncProbe plain(plain_model.ptr());
  DistributedDataParallel<SyncProbe> wrapped(SyncProbe(ddp_model.ptr()), ddp_options(c, true));
  const at::Tensor dummy = at::zeros({1});
  auto once = [&](auto& net, torch::nn::Module& m) {
    m.zero_grad();
    sync_device(device);
    barrier();
    const auto t0 = Clock::now();
    net(dummy).backward();
    sync_device(device);
    return seconds_since(t0);
  };
  std::vector<double> plain_s, ddp_s;
  for (int i = 0; i < c.warmup + c.steps; ++i) {
    double p = once(plain, *plain);
    double d = once(wrapped, *wrapped.module());
    if (i >= c.warmup) {
      plain_s.push_back(p);
      ddp_s.push_back(d);
    }
  }
  json out{{"plain_s", summarize(plain_s)}, {"ddp_s", summarize(ddp_s)}};
  const double sync_s = out["ddp_s"]["median"].get<double>() - out["plain_s"]["median"].get<double>();
  const auto st = wrapped.stats();
  out["sync_s"] = sync_s;
  out["gradient_bytes"] = st.gradient_bytes;
  out["bandwidth_gb_s"] = sync_s > 0 ? st.gradient_bytes / sync_s / 1e9 : 0.0;
  out["ddp_stats"] = stats_json(st);
  return out;
}

void check_config(const RunConfig& c) {
  if (c.side != "ddp" && c.side != "plain") {
    throw InvalidArgument(fmt::format("--side '{}' is unknown: use ddp or plain", c.side));
  }
  if (c.mode != "train" && c.mode != "sync") {
    throw InvalidArgument(fmt::format("--mode '{}' is unknown: use train or sync", c.mode));
  }
  if (c.mode == "sync" && c.side != "ddp") {
    throw InvalidArgument("--mode sync measures DDP: use it with --side ddp");
  }
  if (c.fully_shard && (c.side != "ddp" || c.mode != "train" || c.zero)) {
    throw InvalidArgument("--fully-shard trains sharded across the ranks: use it with --side "
                          "ddp --mode train, without --zero");
  }
  if (!c.fully_shard && (!c.fsdp_prefetch || !c.fsdp_param_dtype.empty())) {
    throw InvalidArgument("--fsdp-no-prefetch and --fsdp-param-dtype set fully_shard's options: "
                          "use them with --fully-shard");
  }
  if (c.fully_shard && c.workload == "cnn") {
    throw InvalidArgument("--fully-shard has mlp and transformer variants, not cnn");
  }
  if (c.zero && c.side != "ddp") {
    throw InvalidArgument("--zero shards the optimizer across DDP's ranks: use it with --side ddp");
  }
  if (c.device != "cpu" && c.device != "cuda") {
    throw InvalidArgument(fmt::format("--device '{}' is unknown: use cpu or cuda", c.device));
  }
  if (c.steps < 1 || c.warmup < 0 || c.pool < 1 || c.threads < 1) {
    throw InvalidArgument("--steps, --pool and --threads must be >= 1, --warmup >= 0");
  }
}

}  // namespace

json summarize(std::vector<double> v) {
  if (v.empty()) return {{"n", 0}, {"median", 0.0}, {"p10", 0.0}, {"p90", 0.0}, {"mean", 0.0}};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)]; };
  double sum = 0;
  for (double x : v) sum += x;
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {{"n", n}, {"median", median}, {"p10", at(0.1)}, {"p90", at(0.9)}, {"mean", sum / n}};
}

json run_benchmark(const RunConfig& c) {
  check_config(c);
  const WorkloadShape s = workload_shape(c.workload, c.tiny, c.batch);
  at::set_num_threads(c.threads);
  const char* env_world = std::getenv("WORLD_SIZE");
  const bool distributed = c.side == "ddp" || (env_world && std::atoi(env_world) > 1);
  if (distributed) {
    InitOptions init;
    init.backend = c.backend;
    init.gloo_threads = c.gloo_threads;
    init_process_group(init);
  }
  const int rank = distributed ? get_rank() : 0;
  const int world = distributed ? get_world_size() : 1;
  json out;
  if (c.fully_shard && s.name == "mlp") {
    out = run_train_sharded(ShardedMlp(s), s, c, rank, world);
  } else if (c.fully_shard) {
    out = run_train_sharded(ShardedTransformerNet(s), s, c, rank, world);
  } else {
    out = with_model(s, [&](auto make) {
      return c.mode == "train" ? run_train(make(), s, c, rank, world)
                               : run_sync(make(), make(), c);
    });
  }
  if (distributed) destroy_process_group();
  if (rank != 0) return json::object();
  out["side"] = c.side;
  out["impl"] = "ddp-cpp";
  out["mode"] = c.mode;
  out["workload"] = c.workload;
  out["world_size"] = world;
  out["batch"] = s.batch;
  out["steps"] = c.steps;
  out["warmup"] = c.warmup;
  out["threads"] = at::get_num_threads();
  out["gloo_threads"] = c.gloo_threads;
  out["device"] = c.device;
  out["backend"] = c.backend;
  out["gradient_as_bucket_view"] = c.gradient_as_bucket_view;
  out["comm_hook"] = c.comm_hook;
  out["find_unused_parameters"] = c.find_unused_parameters;
  out["static_graph"] = c.static_graph;
  out["bucket_cap_mb"] = c.bucket_cap_mb;
  out["optimizer"] = c.optimizer;
  out["zero"] = c.zero;
  out["fully_shard"] = c.fully_shard;
  out["fsdp_prefetch"] = c.fsdp_prefetch;
  out["fsdp_param_dtype"] = c.fsdp_param_dtype;
  out["torch_version"] = TORCH_VERSION;
  return out;
}

}  // namespace ddp::bench
