#include "train.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "ddp/ddp.h"
#include "ddp/datasets/batch_loader.h"
#include "ddp/datasets/fashion_mnist.h"
#include "augment.h"
#include "interrupt.h"
#include "model.h"
#include "report.h"
#include "run_dir.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The whole of `text` as a base-10 integer (strtoll's form); nullopt when it
// is empty, has anything after the number, or is out of range.
std::optional<int64_t> parse_integer(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return std::nullopt;
  return n;
}

// The checkpoint's metadata `key` as a count (an integer >= 0; 0 when the
// key is absent). Throws InvalidArgument naming the file, the key and the
// value when it is not one (a checkpoint this program did not write).
int64_t metadata_count(const Checkpoint& ckpt, const std::string& key) {
  auto it = ckpt.metadata.find(key);
  if (it == ckpt.metadata.end()) return 0;
  const std::optional<int64_t> n = parse_integer(it->second);
  if (!n || *n < 0) {
    throw InvalidArgument(fmt::format(
        "checkpoint '{}': metadata '{}' = '{}' is not a count (an integer >= 0); was it "
        "written by ddp-train? Resume from another checkpoint or start without --resume",
        ckpt.path, key, it->second));
  }
  return *n;
}

struct Run {
  TrainConfig config;
  int rank = 0, world = 1;
  c10::Device device{c10::kCPU};
  FashionCnn net{nullptr};
  // DDP's wrapper; null with --fully-shard (net is then the sharded root).
  std::unique_ptr<DistributedDataParallel<FashionCnn>> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  GradScaler scaler{GradScalerOptions{}};  // set_up: enabled for --amp fp16 only
  std::unique_ptr<datasets::FashionMnist> train_set, test_set;
  int64_t train_size = 0, test_size = 0;
  int start_epoch = 0;
  int64_t step = 0;
  // Note [Resuming inside an epoch]: the learning-rate schedule runs on
  // the current world's steps per epoch, and a resumed epoch starts at the
  // epoch's order's position skip_samples.
  int64_t steps_per_epoch = 1, total_steps = 1;
  int64_t skip_samples = 0;
  LaunchEnv launch;  // read once the group exists (it validated them)
  bool terminal = false;
  Clock::time_point started = Clock::now();
};

c10::Device pick_device(const TrainConfig& c) {
  if (c.device == "cpu") return c10::Device(c10::kCPU);
  if (!torch::cuda::is_available()) {
    throw InvalidArgument(
        "ddp-train: --device cuda, but this libtorch has no CUDA or no GPU is visible; use "
        "--device cpu");
  }
  return local_device();  // cuda:LOCAL_RANK; names a LOCAL_RANK without a GPU
}

// --comm-hook: PyTorch's built-in hooks by their short names.
void register_comm_hook(DistributedDataParallel<FashionCnn>& model, const std::string& name) {
  if (name == "allreduce") model.register_comm_hook(allreduce_hook, "allreduce");
  if (name == "fp16") model.register_comm_hook(fp16_compress_hook, "fp16_compress");
  if (name == "bf16") model.register_comm_hook(bf16_compress_hook, "bf16_compress");
  if (name.rfind("powersgd-", 0) == 0) {
    PowerSGDOptions o;
    o.matrix_approximation_rank = std::stoi(name.substr(9));
    o.start_powerSGD_iter = 10;
    model.register_comm_hook(std::make_shared<PowerSGDState>(o), powerSGD_hook, name);
  }
}

void set_up(Run& r) {
  const TrainConfig& c = r.config;
  InitOptions io;
  io.backend = c.backend;
  io.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
  init_process_group(io);
  r.launch = read_launch_env();
  r.rank = get_rank();
  r.world = get_world_size();
  r.device = pick_device(c);
  datasets::FashionMnistOptions train_opts, test_opts;
  train_opts.data_dir = test_opts.data_dir = c.data_dir;
  test_opts.train = false;
  r.train_set = std::make_unique<datasets::FashionMnist>(train_opts);
  r.test_set = std::make_unique<datasets::FashionMnist>(test_opts);
  auto limit = [](int64_t n, int64_t cap) { return cap > 0 ? std::min(n, cap) : n; };
  r.train_size = limit(r.train_set->size(), c.train_samples);
  r.test_size = limit(r.test_set->size(), c.test_samples);
  torch::manual_seed(c.seed);  // the same initial weights everywhere
  r.net = FashionCnn(c.sync_bn);
  r.net->to(r.device);
  if (c.fully_shard) {
    fully_shard_cnn(r.net);  // the optimizer below steps the shards
  } else {
    DistributedDataParallelOptions o;
    o.find_unused_parameters = c.find_unused_parameters;
    o.static_graph = c.static_graph;
    if (r.device.is_cuda()) o.device_ids = {r.device};
    r.model = std::make_unique<DistributedDataParallel<FashionCnn>>(r.net, o);
    register_comm_hook(*r.model, c.comm_hook);
  }
  double lr = c.scale_lr ? c.lr * r.world : c.lr;
  if (c.optimizer == "sgd") {
    r.optimizer = std::make_unique<torch::optim::SGD>(
        r.net->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  } else {
    r.optimizer = std::make_unique<torch::optim::Adam>(r.net->parameters(),
                                                       torch::optim::AdamOptions(lr));
  }
  GradScalerOptions scaling;  // PyTorch's defaults; only float16 needs one
  scaling.enabled = c.amp == "fp16";
  // Shards differ: an inf in one rank's shard must skip the step everywhere.
  if (c.fully_shard) scaling.process_group = default_group();
  r.scaler = GradScaler(scaling);
  if (c.amp == "fp16" && r.device.is_cpu()) {
    print0("ddp-train: note: --amp fp16 on a CPU runs ATen's slow float16 kernels (seconds per "
           "step); it is for trying the code path: use --amp bf16 on a CPU");
  }
  // The schedule spans the --epochs of the run (each rank takes ceil(its
  // shard / batch) steps per epoch, the same on every rank). --max-steps
  // only stops early, so a run stopped there and resumed follows the same
  // schedule as one that never stopped.
  const int64_t shard = (r.train_size + r.world - 1) / r.world;
  r.steps_per_epoch = (shard + c.batch_size - 1) / c.batch_size;
  r.total_steps = std::max<int64_t>(c.epochs * r.steps_per_epoch, 1);
  torch::manual_seed(c.seed + 1 + static_cast<uint64_t>(r.rank));  // own dropout masks
  r.terminal = broadcast_value<int>(r.rank == 0 && stdout_reaches_terminal(r.launch), 0) != 0;
  // Output and checkpoint directories: checked now on rank 0 (which writes
  // them), failing every rank alike, not at the first checkpoint.
  std::string problem;
  if (r.rank == 0) problem = directory_problem("--out-dir", c.out_dir);
  if (r.rank == 0 && problem.empty()) problem = directory_problem("--checkpoint-dir", c.checkpoint_dir);
  problem = broadcast_string(problem, 0);
  if (!problem.empty()) {
    throw InvalidArgument("ddp-train: " + problem + "; choose a writable directory");
  }
}

// Note [Resuming inside an epoch]: a checkpoint written inside an epoch
// (--max-steps, an interrupt) records how many positions of the epoch's
// sampler order were trained on: after k batches of b on each of W ranks
// the first k*b*W, whatever the world. The resumed run shares out the rest
// among its own ranks (distributed_sampler_indices_after), so a resume on
// another world size (an elastic round) neither skips nor repeats samples;
// on the same world every rank continues its own list exactly. Counting
// batches instead (as ddp-train once did) means other samples on another
// world, and a count that covers the whole epoch on a larger one. The
// schedule follows the samples too: the resumed epoch's steps take the
// positions they have in the new world's schedule (one_cycle_lr).
int64_t samples_into_epoch(const Run& r, const Checkpoint& ckpt) {
  int64_t samples = 0;
  if (ckpt.metadata.count("epoch_samples") != 0) {
    samples = metadata_count(ckpt, "epoch_samples");
  } else {  // written before epoch_samples: batches on the recorded world
    samples = metadata_count(ckpt, "epoch_batches") * r.config.batch_size *
              recorded_world_size(ckpt, r.world);
  }
  if (samples > 0 && samples >= r.train_size) {
    throw InvalidArgument(fmt::format(
        "checkpoint '{}': metadata says {} samples of epoch {} were done, but the epoch has {} "
        "(--train-samples): was it written by another run? Resume from another checkpoint or "
        "start without --resume",
        ckpt.path, samples, ckpt.epoch + 1, r.train_size));
  }
  return samples;
}

void maybe_resume(Run& r) {
  if (!r.config.resume) return;
  const std::string jsonl = r.config.out_dir + "/metrics.jsonl";
  auto ckpt = load_latest_checkpoint(r.config.checkpoint_dir, r.device);
  if (!ckpt) {
    print0("ddp-train: --resume: no checkpoint in " + r.config.checkpoint_dir + ", starting afresh");
    if (r.rank == 0) cut_metrics(jsonl, 0, 0);
    return;
  }
  // Note [One run per directory]: the same run, or an error naming the flags.
  const std::string note = check_resume(*ckpt, r.config, r.world);
  if (!note.empty()) print0(note);
  restore_checkpoint(*ckpt, *r.net, r.optimizer.get());
  if (auto it = ckpt->metadata.find("grad_scaler"); it != ckpt->metadata.end()) {
    try {
      r.scaler.load_state_dict(GradScalerState::from_string(it->second));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("checkpoint '{}': metadata 'grad_scaler': {}", ckpt->path,
                                        e.what()));
    }
  }
  if (r.rank == 0) {
    if (const int dropped = cut_metrics(jsonl, ckpt->step, ckpt->epoch)) {
      print0(fmt::format("ddp-train: --resume: dropped {} line{} of {} written after the "
                         "checkpoint's step {}",
                         dropped, dropped == 1 ? "" : "s", jsonl, ckpt->step));
    }
  }
  r.start_epoch = static_cast<int>(ckpt->epoch);
  r.step = ckpt->step;
  r.skip_samples = samples_into_epoch(r, *ckpt);
  print0(fmt::format("ddp-train: resumed from {} (epoch {}, step {}, {} of the epoch's {} samples "
                     "done)",
                     ckpt->path, r.start_epoch, r.step, r.skip_samples, r.train_size));
  if (r.config.comm_hook.rfind("powersgd-", 0) == 0 && r.step > 0) {
    print0("ddp-train: warning: --comm-hook " + r.config.comm_hook +
           ": PowerSGD's state (error feedback, warm-start P and Q, its step count) is not in "
           "the checkpoint and starts afresh, so this run will not end with exactly the "
           "parameters of an uninterrupted one");
  }
}

// The model's forward: through DDP's wrapper, or the sharded root's.
at::Tensor forward(Run& r, const at::Tensor& x) { return r.model ? (*r.model)(x) : r.net(x); }

void set_training(Run& r, bool on) {
  if (r.model) {
    r.model->train(on);
  } else {
    r.net->train(on);
  }
}

// --fully-shard: BatchNorm's running statistics are buffers, which FSDP
// neither shards nor synchronises; DDP broadcasts rank 0's before every
// forward, so rank 0's are what a DDP run evaluates and saves. Broadcast
// before evaluating, the sharded run evaluates (and its replicas check)
// the same numbers.
void sync_buffers(Run& r) {
  if (r.model) return;
  for (at::Tensor b : r.net->buffers()) broadcast(b, 0);
}

// --amp bf16|fp16: the forward and the loss under autocast on the run's
// device (nothing for --amp none).
std::optional<AutocastGuard> amp_scope(const Run& r) {
  if (r.config.amp == "none") return std::nullopt;
  return std::optional<AutocastGuard>(std::in_place, r.device.type(),
                                      r.config.amp == "bf16" ? at::kBFloat16 : at::kHalf);
}

// Exact accuracy over the first test_size test images: each rank evaluates
// its share without the sampler's padding, so every image counts once.
void evaluate(Run& r, EpochRecord& rec) {
  DistributedSamplerOptions so;
  so.shuffle = false;
  DistributedSampler sampler(r.test_size, so);
  std::vector<int64_t> mine(sampler.indices().begin(),
                            sampler.indices().begin() + sampler.num_unique_samples());
  datasets::BatchLoaderOptions lo;
  lo.batch_size = 500;
  lo.workers = r.config.workers;
  datasets::BatchLoader loader(
      [&](c10::ArrayRef<int64_t> idx) { return r.test_set->get_batch(idx); }, mine, lo);
  sync_buffers(r);
  set_training(r, false);
  torch::NoGradGuard no_grad;
  Metrics m;
  m.add_count("correct", 0);
  m.add_count("images", 0);
  m.add_mean("loss", 0, 0);
  while (auto b = loader.next()) {
    at::Tensor x = b->data.to(r.device), y = b->target.to(r.device);
    const std::optional<AutocastGuard> autocast = amp_scope(r);
    at::Tensor out = forward(r, x);
    m.add_mean("loss", at::cross_entropy_loss(out, y).item<double>(), double(y.size(0)));
    m.add_count("correct", out.argmax(1).eq(y).sum().item<int64_t>());
    m.add_count("images", y.size(0));
  }
  ReducedMetrics all = m.all_reduce();
  rec.test_images = all.count("images");
  rec.test_accuracy = double(all.count("correct")) / double(std::max<int64_t>(rec.test_images, 1));
  rec.test_loss = all.value("loss");
  set_training(r, true);
}

// --fault skip-collective: at the step, every rank but the fault rank calls
// barrier(), which the fault rank skips: the ranks are out of step.
void inject_collective_fault(Run& r) {
  const TrainConfig& c = r.config;
  if (c.fault != "skip-collective" || r.step + 1 != c.fault_step) return;
  if (c.fault_attempt >= 0 && r.launch.restart_count != c.fault_attempt) return;
  if (r.rank != c.fault_rank) {
    ddp::barrier();
    return;
  }
  log(LogLevel::kWarning, fmt::format("ddp-train: injecting fault 'skip-collective' at step {}: "
                                      "skipping the barrier the other ranks call",
                                      c.fault_step));
}

// --fault: fails this rank at the configured step (see config.h).
void inject_fault(Run& r, at::Tensor& out) {
  const TrainConfig& c = r.config;
  if (c.fault.empty() || r.rank != c.fault_rank || r.step + 1 != c.fault_step) return;
  if (c.fault_attempt >= 0 && r.launch.restart_count != c.fault_attempt) return;
  log(LogLevel::kWarning, fmt::format("ddp-train: injecting fault '{}' at step {}", c.fault,
                                      c.fault_step));
  if (c.fault == "crash-in-backward") {
    out.register_hook([](const at::Tensor& grad) {
      std::abort();
      return grad;
    });
  } else if (c.fault == "sigkill") {
    ::raise(SIGKILL);
  } else if (c.fault == "sigstop") {
    ::raise(SIGSTOP);
  } else if (c.fault == "exit") {
    std::_Exit(3);
  }
}

// One epoch of training. Returns the number of the epoch's batches done,
// which is less than all of them when --max-steps stopped it early.
struct EpochProgress {
  int64_t done = 0, batches = 0;  // this run's batches of the epoch, per rank
  int64_t samples = 0;            // positions of the epoch's order trained on, by any run
  int signal = 0;  // Note [Interrupted training]: agreed on inside the epoch
  bool complete() const { return done == batches; }
};

// PyTorch's OneCycleLR (pct_start 0.3, cosine, div_factor 25,
// final_div_factor 1e4) at optimizer step `step` of `total`.
double one_cycle_lr(double peak, int64_t step, int64_t total) {
  const double up = std::max(0.3 * static_cast<double>(total), 1.0);
  auto cosine = [](double from, double to, double t) {
    return to + (from - to) / 2 * (1 + std::cos(M_PI * std::min(std::max(t, 0.0), 1.0)));
  };
  const double s = static_cast<double>(step);
  if (s < up) return cosine(peak / 25, peak, s / up);
  return cosine(peak, peak / 25 / 1e4, (s - up) / std::max(static_cast<double>(total) - up, 1.0));
}

// `position`: the step's place in the run's schedule, epoch * steps per
// epoch + its batch in the epoch (Note [Resuming inside an epoch]).
void set_learning_rate(Run& r, int64_t position) {
  const TrainConfig& c = r.config;
  if (c.schedule != "onecycle") return;
  const double peak = c.scale_lr ? c.lr * r.world : c.lr;
  const double lr = one_cycle_lr(peak, position, r.total_steps);
  for (auto& group : r.optimizer->param_groups()) group.options().set_lr(lr);
}

EpochProgress train_epoch(Run& r, int epoch, EpochRecord& rec) {
  const TrainConfig& c = r.config;
  DistributedSamplerOptions so;
  so.seed = c.seed;
  // Note [Resuming inside an epoch]: the rest of the order after skip_samples.
  const int64_t skipped = std::exchange(r.skip_samples, 0);
  const std::vector<int64_t> indices =
      distributed_sampler_indices_after(r.train_size, so, epoch, skipped);
  const int64_t global_batch = c.batch_size * r.world;
  const int64_t batches = (static_cast<int64_t>(indices.size()) + c.batch_size - 1) / c.batch_size;
  const int64_t before = skipped / global_batch;  // the epoch's batches done, in this world's
  int64_t done = 0;
  datasets::BatchLoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.workers = c.workers;
  lo.seed = c.seed;
  lo.epoch = epoch;
  lo.rank = r.rank;
  lo.first_batch = before;  // a resumed epoch's batches keep their draws
  datasets::BatchLoader loader(
      [&](c10::ArrayRef<int64_t> idx, at::Generator& g) {
        datasets::Batch b = r.train_set->get_batch(idx);
        b.data = augment(b.data, c.augment, g);
        return b;
      },
      indices, lo);
  Progress progress(r.terminal, c.log_every, epoch + 1, c.epochs, before + batches, before);
  Metrics epoch_m, window;  // the epoch's means, and the progress line's
  for (Metrics* m : {&epoch_m, &window}) {  // defined even when no batch runs
    m->add_mean("loss", 0, 0);
    m->add_count("correct", 0);
    m->add_count("samples", 0);
  }
  int64_t window_steps = 0;
  int signal = 0;
  auto start = Clock::now(), window_start = start;
  set_training(r, true);
  while (auto b = loader.next()) {
    at::Tensor x = b->data.to(r.device), y = b->target.to(r.device);
    r.optimizer->zero_grad();
    set_learning_rate(r, epoch * r.steps_per_epoch + before + done);
    inject_collective_fault(r);
    at::Tensor out, loss;
    {
      const std::optional<AutocastGuard> autocast = amp_scope(r);  // --amp
      out = forward(r, x);
      inject_fault(r, out);
      loss = at::cross_entropy_loss(out, y, {}, at::Reduction::Mean, -100, c.label_smoothing);
    }
    r.scaler.scale(loss).backward();  // backward outside autocast, as in Python
    r.scaler.step(*r.optimizer);      // a plain step unless --amp fp16
    r.scaler.update();
    ++r.step;
    ++done;
    double l = loss.item<double>();
    int64_t correct = out.argmax(1).eq(y).sum().item<int64_t>(), n = y.size(0);
    for (Metrics* m : {&epoch_m, &window}) {
      m->add_mean("loss", l, double(n));
      m->add_count("correct", correct);
      m->add_count("samples", n);
    }
    const bool stop = c.max_steps > 0 && r.step >= c.max_steps && done < batches;
    ++window_steps;
    if (progress.due(before + done) || stop) {
      ReducedMetrics w = window.all_reduce();
      double acc = double(w.count("correct")) / double(std::max<int64_t>(w.count("samples"), 1));
      if (r.rank == 0) {
        progress.show(before + done, window_steps, w.value("loss"), acc,
                      w.count("samples") / seconds_since(window_start));
      }
      window.reset();
      window_steps = 0;
      window_start = Clock::now();
    }
    if (stop) break;
    if (done % kAgreeEvery == 0 && done < batches && (signal = agreed_interrupt()) != 0) break;
  }
  if (r.rank == 0) progress.finish();
  rec.epoch_time_s = seconds_since(start);
  ReducedMetrics e = epoch_m.all_reduce();
  rec.train_loss = e.value("loss");
  rec.train_accuracy = double(e.count("correct")) / double(std::max<int64_t>(e.count("samples"), 1));
  rec.samples_per_s = double(e.count("samples")) / std::max(rec.epoch_time_s, 1e-9);
  return {done, batches, skipped + done * global_batch, signal};
}

// The point of data parallelism: every replica ends identical. Checked with
// an exact checksum of all parameters and buffers, gathered from every rank
// (with --fully-shard, of the full parameters gathered from the shards and
// of each rank's buffers: that the shards make one model, and that the
// buffers were synchronised).
void check_replicas(Run& r) {
  double sum = 0, abs_sum = 0;
  std::vector<at::Tensor> params, buffers = r.net->buffers();
  if (r.model) {
    params = r.net->parameters();
  } else {
    sync_buffers(r);
    for (const auto& item : full_state_dict(*r.net)) {
      if (r.net->named_parameters().contains(item.key())) params.push_back(item.value());
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& t : params) {
    sum += t.to(at::kDouble).sum().item<double>();
    abs_sum += t.to(at::kDouble).abs().sum().item<double>();
  }
  for (const auto& t : buffers) sum += t.to(at::kDouble).sum().item<double>();
  struct Checksum {
    double sum, abs_sum;
  };
  auto all = all_gather_value(Checksum{sum, abs_sum});
  for (int k = 1; k < r.world; ++k) {
    if (all[k].sum != all[0].sum || all[k].abs_sum != all[0].abs_sum) {
      throw MismatchError(fmt::format(
          "ddp-train: the replicas differ after training: rank 0's parameter checksum is {:a} "
          "but rank {}'s is {:a}",
          all[0].sum, k, all[k].sum));
    }
  }
  print0(fmt::format("ddp-train: parameters identical on all {} ranks (checksum {:a} {:a})",
                     r.world, sum, abs_sum));
}

// --threads 0: OMP_NUM_THREADS (the first entry of its comma-separated
// list, as OpenMP reads it); 1 when it is unset or empty.
int threads_from_env() {
  const char* name = "OMP_NUM_THREADS";
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 1;
  const std::string text(value);
  const std::string first = text.substr(0, text.find(','));
  const std::optional<int64_t> n = parse_integer(first);
  if (!n || *n < 1 || *n > INT32_MAX) {
    throw InvalidArgument(fmt::format(
        "ddp-train: environment variable {}='{}' is not a positive number of threads: set "
        "it to the torch threads per process, unset it (1 thread), or pass --threads",
        name, text));
  }
  return static_cast<int>(*n);
}

// The checkpoint after an epoch, or where training stopped inside one
// (--max-steps, an interrupt): then epoch_samples says how far it got, so
// --resume continues with the next samples (Note [Resuming inside an
// epoch]). Returns its path.
std::string save_epoch(Run& r, int epoch, const EpochProgress& p) {
  SaveOptions co;
  co.keep_last = 3;
  co.metadata["epoch_samples"] = std::to_string(p.complete() ? 0 : p.samples);
  co.metadata["config"] = config_record(r.config, r.world);
  if (r.scaler.is_enabled()) co.metadata["grad_scaler"] = r.scaler.state_dict().to_string();
  return save_checkpoint(r.config.checkpoint_dir, *r.net, r.optimizer.get(),
                         p.complete() ? epoch + 1 : epoch, r.step, co);
}

void draw_plot(const Run& r, const std::string& jsonl) {
  if (r.rank == 0 && !r.config.no_plot && std::filesystem::exists(jsonl)) {
    plot_metrics(jsonl, r.config.out_dir + "/metrics.png");
  }
}

// Note [Interrupted training]: `saved` is the checkpoint to continue from
// ("" when none was written yet). Returns the exit code.
int stop_interrupted(Run& r, int signal, int epoch, const EpochProgress& p,
                     const std::string& saved, const std::string& jsonl) {
  print0(fmt::format(
      "ddp-train: interrupted by {} at step {} (epoch {}/{}, batch {} of {}); {}. Continue "
      "with the same flags and --resume",
      interrupt_name(signal), r.step, epoch + 1, r.config.epochs, p.done, p.batches,
      saved.empty() ? "no checkpoint was written yet" : "latest checkpoint " + saved));
  draw_plot(r, jsonl);
  barrier();
  destroy_process_group();
  return 128 + signal;
}

}  // namespace

int run(const TrainConfig& config) {
  Run r;
  r.config = config;
  torch::set_num_threads(config.threads > 0 ? config.threads : threads_from_env());
  set_up(r);
  print0(describe(config, r.world));
  claim_run_dir(config, r.rank);  // Note [One run per directory]
  maybe_resume(r);
  if (r.rank == 0) std::filesystem::create_directories(config.out_dir);
  const std::string jsonl = config.out_dir + "/metrics.jsonl";
  install_interrupt_handlers();
  std::string saved;
  for (int epoch = r.start_epoch; epoch < config.epochs; ++epoch) {
    if (config.max_steps > 0 && r.step >= config.max_steps) break;
    EpochRecord rec;
    rec.epoch = epoch + 1;
    rec.world_size = r.world;
    rec.global_batch = config.batch_size * r.world;
    EpochProgress p = train_epoch(r, epoch, rec);
    if (p.signal != 0) {
      return stop_interrupted(r, p.signal, epoch, p, save_epoch(r, epoch, p), jsonl);
    }
    evaluate(r, rec);
    rec.steps = r.step;
    rec.wall_time_s = seconds_since(r.started);
    print0(fmt::format(
        "epoch {}/{}: train loss {:.4f} acc {:.2f} % | test loss {:.4f} acc {:.2f} % ({} images) "
        "| {:.0f} samples/s, {:.1f} s",
        rec.epoch, config.epochs, rec.train_loss, rec.train_accuracy * 100, rec.test_loss,
        rec.test_accuracy * 100, rec.test_images, rec.samples_per_s, rec.epoch_time_s));
    // The epoch's line and its checkpoint as one (Note [One run per
    // directory]): the line is taken back when the checkpoint fails.
    const int64_t mark = r.rank == 0 ? metrics_mark(jsonl) : 0;
    if (r.rank == 0) append_metrics(jsonl, rec);
    try {
      saved = save_epoch(r, epoch, p);
    } catch (...) {
      if (r.rank == 0) metrics_rollback(jsonl, mark);
      throw;
    }
    if (!p.complete()) break;
    // A signal during the evaluation or the save: stop before the next epoch.
    if (epoch + 1 < config.epochs) {
      if (const int signal = agreed_interrupt()) {
        return stop_interrupted(r, signal, epoch + 1, EpochProgress{0, p.batches, 0}, saved, jsonl);
      }
    }
  }
  if (r.model) print0(to_string(r.model->stats()));
  check_replicas(r);
  draw_plot(r, jsonl);
  barrier();
  destroy_process_group();
  return 0;
}

}  // namespace ddp::train
