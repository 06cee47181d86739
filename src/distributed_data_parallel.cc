// DistributedDataParallel's non-template part: construction (parameter
// collection, verification, initial broadcast), the forward bookkeeping
// (buffer broadcast, reducer preparation) and no_sync.
#include "ddp/distributed_data_parallel.h"

#include <ATen/ops/full.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <unordered_set>

#include "call_scope.h"
#include "ddp/error.h"
#include "ddp_core.h"
#include "ddp_env.h"
#include "group_bucket_comm.h"
#include "model_sync.h"
#include "process_group_impl.h"
#include "tensor_text.h"

namespace ddp::detail {

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module,
                 const DistributedDataParallelOptions& options)
    : module_(std::move(module)), options_(options) {
  if (!module_) throw InvalidArgument("DistributedDataParallel: the module is null");
  check_options();
  check_no_sparse_gradients();
  group_ = options_.process_group ? options_.process_group : default_group();
  copts_ = CollectiveOptions{group_, options_.timeout};
  std::vector<NamedTensor> all;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  collect(all, names, params);
  check_group_device();
  for (const auto& t : all) state_tensors_.push_back(t.tensor);
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    wrapped_.push_back({item.key(), t.unsafeGetTensorImpl(), t.requires_grad(), t.sizes().vec()});
  }
  if (options_.init_sync && group_->size() > 1) {
    const detail::CallScope call(
        "DistributedDataParallel's construction",
        "Every rank constructs its DistributedDataParallel, with the same model, at the same "
        "point");
    verify_same_model(all, copts_);
    broadcast_coalesced(state_tensors_, 0, copts_);
  }
  ReducerOptions ro;
  ro.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20));
  ro.first_bucket_cap_bytes = static_cast<int64_t>(options_.first_bucket_cap_mb * (1 << 20));
  ro.bucket_cap_bytes = std::max<int64_t>(ro.bucket_cap_bytes, 1);
  ro.first_bucket_cap_bytes = std::max<int64_t>(ro.first_bucket_cap_bytes, 1);
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ro.static_graph = options_.static_graph;
  ro.timeout = options_.timeout;
  ro.reduce_alone = read_ddp_env().reduce_alone;
  ro.debug = group_->impl().debug;
  setup_mixed_precision(ro);
  // The fused all_reduce counts the ranks that used each parameter in the
  // bucket's dtype: beyond the world sizes whose counts are exact there
  // (2^8 in bfloat16, 2^11 in float16), the flags travel apart in float32.
  const c10::ScalarType bucket = ro.bucket_dtype.value_or(at::kFloat);
  const bool counts_exact = (bucket != at::kBFloat16 || group_->size() <= 256) &&
                            (bucket != at::kHalf || group_->size() <= 2048);
  std::unique_ptr<BucketComm> comm =
      counts_exact ? make_fused_all_reduce({group_, options_.timeout})
                   : make_hook_comm({group_, options_.timeout}, allreduce_hook,
                                    "built-in all_reduce (used flags apart, in float32)");
  reducer_ = Reducer::create(std::move(names), std::move(params), group_, std::move(comm), ro);
}

void DdpCore::check_options() const {
  if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_cap_mb > 0)) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallelOptions: bucket_cap_mb ({}) and "
        "first_bucket_cap_mb ({}) must be > 0",
        options_.bucket_cap_mb, options_.first_bucket_cap_mb));
  }
  check_mixed_precision(options_);
  if (options_.device_ids.size() > 1) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallelOptions::device_ids has {} devices; a module "
        "must live on one device per process (as in PyTorch): pass "
        "{{cuda:local_rank}}",
        options_.device_ids.size()));
  }
}

// After the initial broadcast, as PyTorch (which casts in _ddp_init_helper).
void DdpCore::setup_mixed_precision(ReducerOptions& ro) {
  if (!options_.mixed_precision) return;
  const MixedPrecision& mp = *options_.mixed_precision;
  if (mp.buffer_dtype) {
    at::NoGradGuard no_grad;
    for (at::Tensor& b : buffers_) {
      if (b.is_floating_point()) b.set_data(b.to(*mp.buffer_dtype));
    }
  }
  ro.bucket_dtype = mp.reduce_dtype ? mp.reduce_dtype : mp.param_dtype;
  if (!mp.param_dtype) return;
  low_params_ = std::make_shared<MixedPrecisionParams>(
      unique_parameters(*module_, /*recurse=*/true), *mp.param_dtype);
  ro.on_backward_end = [low = low_params_] { low->restore(); };
}

// NCCL reduces CUDA tensors on the group's device; a CPU module's buckets
// would be staged through it twice per bucket (Note [Staging on NCCL]),
// another GPU's would fail inside NCCL.
void DdpCore::check_group_device() const {
  if (!device_ || group_->backend() != "nccl" || *device_ == group_->device()) return;
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: the module is on {}, but the process group's backend "
      "'nccl' reduces tensors on {} (this rank's GPU: InitOptions::device_id, "
      "cuda:LOCAL_RANK by default). Move the module there first (module->to(ddp::local_device())), "
      "or use backend 'gloo' for a CPU module",
      device_->str(), group_->device().str()));
}

at::Tensor DdpCore::input_to_device(const at::Tensor& input, size_t index) const {
  if (!input.defined()) return input;
  const auto& mp = options_.mixed_precision;
  if (mp && mp->param_dtype && input.is_floating_point() &&
      input.scalar_type() != *mp->param_dtype) {
    // After the device check or move (PyTorch's _cast_forward_inputs).
    return input_to_device(input.to(*mp->param_dtype), index);
  }
  if (!options_.device_ids.empty()) {
    const c10::Device target = options_.device_ids[0];
    return input.device() == target ? input : input.to(target);
  }
  if (!device_ || input.device() == *device_ || !input.is_floating_point()) return input;
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: forward's argument {} is a {} tensor on {}, but the module's "
      "parameters are on {}. Move it first (.to({})), or construct the wrapper with "
      "device_ids = {{{}}}, which moves tensor arguments there as PyTorch's DDP does",
      index + 1, describe_tensor(input), input.device().str(), device_->str(),
      device_->str(), device_->str()));
}

// Embedding and EmbeddingBag with sparse=true produce sparse gradients,
// which the reducer's dense buckets cannot hold: refused here rather than
// in the middle of the first backward (which would leave the buckets
// half-reduced).
void DdpCore::check_no_sparse_gradients() const {
  for (const auto& item : module_->named_modules()) {
    bool sparse = false;
    const char* kind = "";
    if (auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(item.value().get())) {
      sparse = e->options.sparse();
      kind = "Embedding";
    } else if (auto* b = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(item.value().get())) {
      sparse = b->options.sparse();
      kind = "EmbeddingBag";
    }
    if (sparse) {
      const std::string name = item.key().empty() ? "weight" : item.key() + ".weight";
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' ({} with sparse=true) would "
          "get sparse gradients, which ddp does not reduce. Construct the {} "
          "with sparse(false): its gradient is then dense and reduced like the "
          "others (use a dense optimizer such as Adam or SGD)",
          name, kind, kind));
    }
  }
}

// Cheap enough for every forward: one pass over named_parameters().
void DdpCore::check_model_unchanged() const {
  auto now = module_->named_parameters(/*recurse=*/true);
  bool same = now.size() == wrapped_.size();
  for (size_t i = 0; same && i < now.size(); ++i) {
    const at::Tensor& t = now[i].value();
    const WrappedParam& w = wrapped_[i];
    same = t.unsafeGetTensorImpl() == w.impl && t.requires_grad() == w.requires_grad &&
           t.sizes().equals(w.sizes);
  }
  if (same) return;
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: the model changed after it was wrapped: {}. "
      "The reducer still holds the parameters it was built with, so training "
      "on would leave part of the model unreduced and the ranks would drift "
      "apart. Wrap the changed model again (construct a new "
      "DistributedDataParallel on every rank), or make the change before "
      "wrapping",
      describe_model_change()));
}

// The first difference between the model now and as wrapped.
std::string DdpCore::describe_model_change() const {
  auto now = module_->named_parameters(/*recurse=*/true);
  for (const WrappedParam& w : wrapped_) {
    const at::Tensor* t = now.find(w.name);
    if (t == nullptr) return fmt::format("parameter '{}' was removed", w.name);
    if (t->unsafeGetTensorImpl() != w.impl) {
      return fmt::format(
          "parameter '{}' is another tensor now (its module or the parameter "
          "was replaced)",
          w.name);
    }
    if (t->requires_grad() != w.requires_grad) {
      return fmt::format("requires_grad of parameter '{}' changed from {} to {}", w.name,
                         w.requires_grad, t->requires_grad());
    }
    if (!t->sizes().equals(w.sizes)) {
      return fmt::format("parameter '{}' changed shape from [{}] to [{}]", w.name,
                         fmt::join(w.sizes, ", "), fmt::join(t->sizes(), ", "));
    }
  }
  for (const auto& item : now) {
    bool known = std::any_of(wrapped_.begin(), wrapped_.end(),
                             [&](const WrappedParam& w) { return w.name == item.key(); });
    if (!known) return fmt::format("parameter '{}' was added", item.key());
  }
  return "the order of its parameters changed";
}

// Parameters deduplicated by identity (tied weights once, under their first
// name); frozen ones are verified and broadcast but not reduced.
void DdpCore::collect(std::vector<NamedTensor>& all, std::vector<std::string>& names,
                      std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> seen;
  std::optional<std::pair<std::string, c10::Device>> device;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    if (!device) {
      device.emplace(item.key(), t.device());
      device_ = t.device();
    }
    if (t.device() != device->second) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' is on {} but '{}' is on {}; "
          "move the whole module to one device (module->to(device)) first",
          item.key(), t.device().str(), device->first, device->second.str()));
    }
    if (!options_.device_ids.empty() && t.device() != options_.device_ids[0]) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' is on {} but device_ids "
          "names {}; call module->to({}) before wrapping",
          item.key(), t.device().str(), options_.device_ids[0].str(),
          options_.device_ids[0].str()));
    }
    all.push_back({"parameter", item.key(), t});
    if (t.requires_grad()) {
      names.push_back(item.key());
      params.push_back(t);
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    all.push_back({"buffer", item.key(), item.value()});
    buffers_.push_back(item.value());
  }
}

void DdpCore::pre_forward() {
  forward_start_ = Clock::now();
  check_model_unchanged();
  if (low_params_ && low_params_->cast()) reducer_->refresh_hooks();
  if (syncing_now()) {
    if (join_) {
      // Note [Join protocol]: the first collective of every synchronised
      // iteration; finished ranks answer it from shadow_iteration().
      int training = count_ranks_training(true);
      reducer_->set_iteration_users(
          training, join_->divide_by_initial_world_size ? group_->size() : training);
    }
    reducer_->prepare_for_forward();
  }
  if (buffers_due()) sync_buffers(/*candidate=*/true);
}

bool DdpCore::buffers_due() const {
  return options_.broadcast_buffers && require_forward_param_sync_ && !buffers_.empty() &&
         group_->size() > 1;
}

// Rank 0's buffers, or with join the highest rank still training (a
// finished rank's buffers are stale).
void DdpCore::sync_buffers(bool candidate) {
  const detail::CallScope call("DDP forward (buffer broadcast)");
  auto t0 = Clock::now();
  int src = 0;
  if (join_) {
    at::Tensor r = at::full({1}, candidate ? group_->rank() : -1, at::kInt);
    all_reduce(r, ReduceOp::MAX, copts_);
    src = r.item<int>();
  }
  broadcast_coalesced(buffers_, src, copts_);
  buffer_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void DdpCore::post_forward(const std::vector<at::Tensor>& outputs, bool known) {
  if (syncing_now()) {
    require_forward_param_sync_ = true;
    reducer_->prepare_for_backward(outputs, known);
  } else {
    require_forward_param_sync_ = false;
    // Without grad mode the forward builds no graph: no backward can follow
    // (and no backward will swap the full-precision parameters back).
    if (at::GradMode::is_enabled()) {
      reducer_->forward_without_sync();
    } else if (low_params_) {
      low_params_->restore();
    }
  }
  ++forwards_;
  forward_s_ += std::chrono::duration<double>(Clock::now() - forward_start_).count();
}

void DdpCore::set_grad_sync(bool enabled) {
  grad_sync_ = enabled;
  reducer_->set_sync_requested(enabled);
}

void DdpCore::sync_buffers_now() {
  if (buffers_.empty() || group_->size() == 1) return;
  sync_buffers(/*candidate=*/true);
}

DdpStats DdpCore::stats() const {
  const Reducer::Stats r = reducer_->stats();
  DdpStats s;
  s.iterations = r.iterations;
  s.world_size = r.world_size;
  s.bucket_bytes = r.bucket_bytes;
  s.bucket_params = r.bucket_params;
  s.parameters = r.parameters;
  s.gradient_bytes = r.gradient_bytes;
  s.buckets_rebuilt = r.buckets_rebuilt;
  s.shared_memory_buckets = r.shared_memory_buckets;
  s.unused_parameters_last = r.unused_parameters_last;
  s.backward_compute_s = r.backward_compute_s;
  s.backward_comm_s = r.backward_comm_s;
  s.exposed_comm_s = r.exposed_comm_s;
  s.comm_hook = r.comm_hook;
  double n = static_cast<double>(std::max<int64_t>(forwards_, 1));
  s.forward_s = forward_s_ / n;
  s.buffer_broadcast_s = buffer_s_ / n;
  return s;
}

std::shared_ptr<DdpCore> make_ddp_core(std::shared_ptr<torch::nn::Module> module,
                                       const DistributedDataParallelOptions& options) {
  return std::make_shared<DdpCore>(std::move(module), options);
}
void pre_forward(DdpCore& core) { core.pre_forward(); }
void post_forward(DdpCore& core, const std::vector<at::Tensor>& outputs, bool known) {
  core.post_forward(outputs, known);
}
bool wants_outputs(const DdpCore& core) { return core.wants_outputs(); }
at::Tensor input_to_device(const DdpCore& core, const at::Tensor& input, size_t index) {
  return core.input_to_device(input, index);
}
void set_grad_sync(DdpCore& core, bool enabled) { core.set_grad_sync(enabled); }
bool grad_sync(const DdpCore& core) { return core.grad_sync(); }
void sync_buffers(DdpCore& core) { core.sync_buffers_now(); }

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const at::Tensor& t : module.parameters(recurse)) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

torch::OrderedDict<std::string, at::Tensor> unique_named_parameters(
    const torch::nn::Module& module, bool recurse) {
  torch::OrderedDict<std::string, at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(recurse)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      out.insert(item.key(), item.value());
    }
  }
  return out;
}
DdpStats stats(const DdpCore& core) { return core.stats(); }

void DdpCore::register_comm_hook(CommHook hook, std::string name) {
  reducer_->register_comm_hook(
      make_hook_comm({group_, options_.timeout}, std::move(hook), std::move(name)));
}

void register_comm_hook(DdpCore& core, CommHook hook, std::string name) {
  core.register_comm_hook(std::move(hook), std::move(name));
}

}  // namespace ddp::detail

namespace ddp {

NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::DdpCore> core) : core_(std::move(core)) {
  previous_ = detail::grad_sync(*core_);
  detail::set_grad_sync(*core_, false);
}
NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : core_(std::move(other.core_)), previous_(other.previous_) {}
NoSyncGuard::~NoSyncGuard() {
  if (core_) detail::set_grad_sync(*core_, previous_);
}

std::string to_string(const DdpStats& s) {
  return fmt::format(
      "ddp: {} iterations, world {}, {} params in {} buckets ({:.2f} MiB{}{}), "
      "forward {:.2f} ms, backward compute {:.2f} ms, comm {:.2f} ms, exposed "
      "comm {:.2f} ms, buffer broadcast {:.2f} ms, unused {}{}",
      s.iterations, s.world_size, s.parameters, s.bucket_bytes.size(),
      s.gradient_bytes / double(1 << 20), s.buckets_rebuilt ? ", rebuilt" : "",
      s.shared_memory_buckets > 0 ? ", in shared memory" : "",
      s.forward_s * 1e3, s.backward_compute_s * 1e3, s.backward_comm_s * 1e3,
      s.exposed_comm_s * 1e3, s.buffer_broadcast_s * 1e3, s.unused_parameters_last,
      s.comm_hook.empty() || s.comm_hook.rfind("built-in", 0) == 0 ? ""
                                                                   : ", comm hook " + s.comm_hook);
}

}  // namespace ddp
