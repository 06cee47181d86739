// Checkpoints: capture and restore of model, optimizer and RNG state, and the
// collective save/load protocol (rank 0 writes, every rank reads).
#include "ddp/checkpoint.h"

#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <typeinfo>

#include "call_scope.h"
#include "checkpoint_files.h"
#include "checkpoint_format.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "error_signs.h"
#include "fsdp/fsdp_checkpoint.h"
#include "optimizer_state.h"
#include "tensor_text.h"
#include "torch_save.h"

namespace ddp {
namespace detail {

RngState capture_rng() {
  RngState s;
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu = gen.get_state();
  }
  if (at::hasCUDA()) {
    const int n = at::detail::getCUDAHooks().getNumGPUs();
    for (int i = 0; i < n; ++i) {
      at::Generator gen = at::globalContext().defaultGenerator(
          c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.cuda.push_back(gen.get_state());
    }
  }
  return s;
}

void restore_rng(const RngState& s, const std::string& source) {
  try {
    if (s.cpu.defined()) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(s.cpu);
    }
    const size_t n = at::hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
    for (size_t i = 0; i < std::min(n, s.cuda.size()); ++i) {
      at::Generator gen = at::globalContext().defaultGenerator(
          c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(s.cuda[i]);
    }
  } catch (const c10::Error& e) {
    throw InvalidArgument("checkpoint '" + source +
                          "': cannot restore the RNG state: " +
                          e.what_without_backtrace());
  }
}

}  // namespace detail

namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A "module." common to all keys dropped (a wrapper's submodule).
void drop_module_prefix(NamedTensors& out) {
  const std::string prefix = "module.";
  bool all_prefixed = !out.empty();
  for (const auto& [name, t] : out) {
    all_prefixed = all_prefixed && name.compare(0, prefix.size(), prefix) == 0;
  }
  if (all_prefixed) {
    for (auto& entry : out) entry.first.erase(0, prefix.size());
  }
}

// Parameters then buffers, with a "module." common to all keys dropped.
NamedTensors named_state(const torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    out.emplace_back(p.key(), p.value());
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    if (b.value().defined()) out.emplace_back(b.key(), b.value());
  }
  drop_module_prefix(out);
  return out;
}

// A sharded root's full state (fully_shard.h, "Checkpoints"), gathered on
// every rank: a collective of the units' group.
struct FullState {
  NamedTensors model;
  std::shared_ptr<const OptimizerState> optimizer;
};
FullState gather_full_state(FullyShardUnit& root, const torch::optim::Optimizer* optimizer) {
  FullState out;
  for (const auto& item : full_state_dict(root)) out.model.emplace_back(item.key(), item.value());
  drop_module_prefix(out.model);
  if (optimizer != nullptr) {
    out.optimizer =
        std::make_shared<const OptimizerState>(full_optimizer_state_dict(root, *optimizer));
  }
  return out;
}

// Throws naming the first key where checkpoint and model differ.
void check_fits(const Checkpoint& ckpt, const NamedTensors& model) {
  const size_t n = std::max(ckpt.model.size(), model.size());
  for (size_t i = 0; i < n; ++i) {
    std::string diff;
    if (i >= ckpt.model.size()) {
      diff = "key '" + model[i].first + "' of the model is missing from the checkpoint";
    } else if (i >= model.size()) {
      diff = "key '" + ckpt.model[i].key() + "' of the checkpoint is not in the model";
    } else {
      const auto& [name, t] = model[i];
      const auto& saved = ckpt.model[i];
      if (saved.key() != name) {
        diff = "key " + std::to_string(i) + " is '" + saved.key() +
               "' in the checkpoint but '" + name + "' in the model";
      } else if (saved.value().sizes() != t.sizes() ||
                 saved.value().scalar_type() != t.scalar_type()) {
        diff = "key '" + name + "' is " + detail::describe_tensor(saved.value()) +
               " in the checkpoint but " + detail::describe_tensor(t) + " in the model";
      }
    }
    if (!diff.empty()) {
      throw InvalidArgument("checkpoint '" + ckpt.path +
                            "' does not fit this model: " + diff +
                            " (" + std::to_string(ckpt.model.size()) + " vs " +
                            std::to_string(model.size()) +
                            " tensors); load it into the model it was saved "
                            "from, or start without it");
    }
  }
}

ProcessGroupPtr resolve_group(const ProcessGroupPtr& group) {
  if (group) return group;
  return is_initialized() ? default_group() : nullptr;
}

void check_epoch_step(int64_t epoch, int64_t step) {
  if (epoch < 0 || step < 0) {
    throw InvalidArgument("checkpoint: epoch (" + std::to_string(epoch) +
                          ") and step (" + std::to_string(step) +
                          ") must be >= 0");
  }
}

// Rank 0's part of save_checkpoint: everything that touches the disk.
void write_checkpoint(const std::string& dir, Checkpoint ckpt,
                      const SaveOptions& options) {
  detail::ensure_directory(dir);
  detail::remove_stale_temporaries(dir);
  const std::string stem = detail::checkpoint_stem(ckpt.epoch, ckpt.step);
  // The model file and the checkpoint are one unit: the model file first,
  // and removed again when the checkpoint cannot be written (a full disk),
  // so a model file never stands beside a missing checkpoint (one left by a
  // crash between the two renames goes with the stale temporaries).
  const std::string model_path = dir + "/" + stem + detail::kModelSuffix;
  if (options.write_torch_model) {
    std::vector<char> bytes = detail::torch_save_bytes(ckpt.model);
    detail::write_file_atomically(dir, stem + detail::kModelSuffix,
                                  bytes.data(), bytes.size());
  }
  try {
    std::string bytes = detail::serialize_checkpoint(ckpt);
    detail::write_file_atomically(dir, stem + detail::kCheckpointSuffix,
                                  bytes.data(), bytes.size());
  } catch (...) {
    if (options.write_torch_model) ::unlink(model_path.c_str());
    throw;
  }
  detail::prune_checkpoints(dir, options.keep_last);
}

}  // namespace

namespace {

Checkpoint capture_from(const NamedTensors& state,
                        std::shared_ptr<const OptimizerState> optimizer, int64_t epoch,
                        int64_t step) {
  check_epoch_step(epoch, step);
  Checkpoint c;
  c.epoch = epoch;
  c.step = step;
  for (const auto& [name, t] : state) {
    if (c.model.contains(name)) {
      throw InvalidArgument("checkpoint: the model has two tensors named '" +
                            name + "' (after dropping \"module.\")");
    }
    c.model.insert(name, t.detach().to(at::TensorOptions().device(at::kCPU),
                                       /*non_blocking=*/false, /*copy=*/true));
  }
  c.optimizer = std::move(optimizer);
  c.rng.push_back(detail::capture_rng());
  return c;
}

}  // namespace

Checkpoint capture_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              int64_t epoch, int64_t step) {
  if (detail::checkpoint_root(model, "capture_checkpoint") != nullptr) {
    throw InvalidArgument(
        "capture_checkpoint: the model is sharded (fully_shard), and this rank holds only its "
        "shards; use save_checkpoint (a collective that gathers the full state), or "
        "full_state_dict and full_optimizer_state_dict");
  }
  std::shared_ptr<const OptimizerState> state;
  if (optimizer != nullptr) {
    state = std::make_shared<const OptimizerState>(detail::capture_optimizer(*optimizer));
  }
  return capture_from(named_state(model), std::move(state), epoch, step);
}

void restore_checkpoint(const Checkpoint& ckpt, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer,
                        const RestoreOptions& options) {
  FullyShardUnit* root = detail::checkpoint_root(model, "restore_checkpoint");
  NamedTensors live = root ? detail::full_shape_state(*root) : named_state(model);
  std::vector<std::string> own_names;  // before "module." is dropped
  for (const auto& entry : live) own_names.push_back(entry.first);
  drop_module_prefix(live);
  check_fits(ckpt, live);
  int rank = options.rank;
  if (rank < 0) rank = is_initialized() ? get_rank() : 0;
  const RngState* rng = nullptr;
  if (options.rng && rank < static_cast<int>(ckpt.rng.size())) {
    rng = &ckpt.rng[rank];
    at::Tensor now = detail::capture_rng().cpu;
    if (rng->cpu.defined() && rng->cpu.numel() != now.numel()) {
      throw InvalidArgument("checkpoint '" + ckpt.path + "': its CPU RNG state has " +
                            std::to_string(rng->cpu.numel()) + " bytes, this libtorch's " +
                            std::to_string(now.numel()) +
                            "; restore with RestoreOptions::rng = false");
    }
  }
  if (options.optimizer && optimizer != nullptr && ckpt.optimizer) {
    // Validates fully before changing the optimizer; the model is next.
    if (root != nullptr) {
      load_full_optimizer_state_dict(*root, *optimizer, *ckpt.optimizer, ckpt.path);
    } else {
      detail::restore_optimizer(*ckpt.optimizer, *optimizer, ckpt.path);
    }
  }
  if (root != nullptr) {  // each rank takes its rows (check_fits checked all)
    torch::OrderedDict<std::string, at::Tensor> full;
    for (size_t i = 0; i < live.size(); ++i) full.insert(own_names[i], ckpt.model[i].value());
    load_full_state_dict(*root, full);
  } else {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) {
      live[i].second.copy_(ckpt.model[i].value());
    }
  }
  if (rng != nullptr) detail::restore_rng(*rng, ckpt.path);
}

std::string save_checkpoint(const std::string& dir,
                            const torch::nn::Module& model,
                            const torch::optim::Optimizer* optimizer,
                            int64_t epoch, int64_t step,
                            const SaveOptions& options) {
  check_epoch_step(epoch, step);
  const detail::CallScope call("save_checkpoint", detail::kCollectiveCheckpointAdvice);
  const ProcessGroupPtr group = resolve_group(options.process_group);
  const int rank = group ? group->rank() : 0;
  // A sharded optimizer's full state is gathered on the writing rank first
  // (a collective of its group: every rank is here).
  if (auto* sharded = dynamic_cast<const ShardedOptimizer*>(optimizer)) {
    if (sharded->group() != group) {  // the same on every rank: no one waits
      throw InvalidArgument(
          "save_checkpoint: the sharded optimizer (" + c10::demangle(typeid(*optimizer).name()) +
          ") runs on another process group than the checkpoint (SaveOptions::process_group); "
          "its state is gathered on the writing rank, so give both the same group");
    }
    sharded->consolidate_state_dict(0);
  }
  // A sharded model's full state, gathered on every rank of its group.
  std::optional<FullState> full;
  if (FullyShardUnit* root = detail::checkpoint_root(model, "save_checkpoint")) {
    full = gather_full_state(*root, optimizer);
  }
  CollectiveOptions co;
  co.group = group;
  detail::ByteWriter mine;
  detail::write_rng(mine, detail::capture_rng());
  std::vector<std::string> rngs{mine.bytes()};
  if (group) rngs = all_gather_string(mine.bytes(), co);

  const std::string path = dir + "/" + detail::checkpoint_stem(epoch, step) +
                           detail::kCheckpointSuffix;
  std::exception_ptr failure;
  std::string error;
  if (rank == 0) {
    try {
      Checkpoint c = full ? capture_from(full->model, full->optimizer, epoch, step)
                          : capture_checkpoint(model, optimizer, epoch, step);
      c.metadata = options.metadata;
      c.rng.clear();
      for (const std::string& b : rngs) {
        detail::ByteReader r(b.data(), b.size(), "RNG state from a rank");
        c.rng.push_back(detail::read_rng(r));
      }
      write_checkpoint(dir, std::move(c), options);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      error = e.what();
      if (error.empty()) error = "unknown error";
    }
  }
  // The outcome doubles as the barrier: no rank continues before the file
  // is durable, and no rank continues believing it was saved when it was not.
  if (group) error = broadcast_string(error, 0, co);
  if (failure) std::rethrow_exception(failure);
  if (!error.empty()) {
    throw InvalidArgument("rank 0 could not save checkpoint '" + path + "': " + error + " (" +
                          detail::kReportedByAnotherRank +
                          ": save_checkpoint is collective, so every rank fails with it)");
  }
  return path;
}

std::optional<std::string> latest_checkpoint_path(const std::string& dir) {
  std::vector<detail::ListedCheckpoint> all = detail::list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return dir + "/" + all.back().stem + detail::kCheckpointSuffix;
}

Checkpoint load_checkpoint(const std::string& path, const c10::Device& device) {
  return detail::parse_checkpoint(detail::read_whole_file(path), path, device);
}

std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const c10::Device& device,
                                                 const LoadOptions& options) {
  const detail::CallScope call("load_latest_checkpoint", detail::kCollectiveCheckpointAdvice);
  const ProcessGroupPtr group = resolve_group(options.process_group);
  CollectiveOptions co;
  co.group = group;
  // Rank 0 decides which file: "+<path>", "-" for none, "!<error>".
  std::string choice;
  if (!group || group->rank() == 0) {
    try {
      auto latest = latest_checkpoint_path(dir);
      choice = latest ? "+" + *latest : "-";
    } catch (const std::exception& e) {
      choice = std::string("!") + e.what();
    }
  }
  if (group) choice = broadcast_string(choice, 0, co);
  if (choice[0] == '!') {
    if (!group || group->rank() == 0) throw InvalidArgument(choice.substr(1));
    throw InvalidArgument("rank 0 could not list the checkpoints: " + choice.substr(1) + " (" +
                          detail::kReportedByAnotherRank +
                          ": load_latest_checkpoint is collective, so every rank fails with it)");
  }
  if (choice[0] == '-') return std::nullopt;

  const std::string path = choice.substr(1);
  std::optional<Checkpoint> result;
  std::exception_ptr failure;
  std::string error;
  try {
    result = load_checkpoint(path, device);
  } catch (const std::exception& e) {
    failure = std::current_exception();
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  if (!group) {
    if (failure) std::rethrow_exception(failure);
    return result;
  }
  std::vector<std::string> errors = all_gather_string(error, co);
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw InvalidArgument("rank " + std::to_string(r) + " could not load checkpoint '" + path +
                            "': " + errors[r] + " (" + detail::kReportedByAnotherRank +
                            ": load_latest_checkpoint is collective, so every rank fails "
                            "with it)");
    }
  }
  return result;
}

}  // namespace ddp
