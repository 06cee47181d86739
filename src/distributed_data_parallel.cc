// DistributedDataParallel's non-template part: construction (parameter
// collection, verification, initial broadcast), the forward bookkeeping
// (buffer broadcast, reducer preparation) and no_sync.
#include "ddp/distributed_data_parallel.h"

#include <ATen/ops/full.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <unordered_set>

#include "ddp/error.h"
#include "ddp_core.h"
#include "model_sync.h"

namespace ddp::detail {

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module,
                 const DistributedDataParallelOptions& options)
    : module_(std::move(module)), options_(options) {
  if (!module_) throw InvalidArgument("DistributedDataParallel: the module is null");
  check_options();
  group_ = options_.process_group ? options_.process_group : default_group();
  copts_ = CollectiveOptions{group_, options_.timeout};
  std::vector<NamedTensor> all;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  collect(all, names, params);
  for (const auto& t : all) state_tensors_.push_back(t.tensor);
  if (options_.init_sync && group_->size() > 1) {
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
  ro.timeout = options_.timeout;
  reducer_ = Reducer::create(std::move(names), std::move(params), group_, ro);
}

void DdpCore::check_options() const {
  if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_cap_mb > 0)) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallelOptions: bucket_cap_mb ({}) and "
        "first_bucket_cap_mb ({}) must be > 0",
        options_.bucket_cap_mb, options_.first_bucket_cap_mb));
  }
  if (options_.static_graph) {
    throw InvalidArgument(
        "DistributedDataParallelOptions::static_graph is not supported yet; "
        "leave it false (find_unused_parameters covers dynamic graphs)");
  }
  if (options_.device_ids.size() > 1) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallelOptions::device_ids has {} devices; a module "
        "must live on one device per process (as in PyTorch): pass "
        "{{cuda:local_rank}}",
        options_.device_ids.size()));
  }
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
    if (!device) device.emplace(item.key(), t.device());
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
  if (options_.broadcast_buffers && require_forward_param_sync_ && !buffers_.empty() &&
      group_->size() > 1) {
    sync_buffers(/*candidate=*/true);
  }
}

// Rank 0's buffers, or with join the highest rank still training (a
// finished rank's buffers are stale).
void DdpCore::sync_buffers(bool candidate) {
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
    reducer_->forward_without_sync();
  }
  ++forwards_;
  forward_s_ += std::chrono::duration<double>(Clock::now() - forward_start_).count();
}

DdpStats DdpCore::stats() const {
  DdpStats s;
  reducer_->fill_stats(s);
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
void set_grad_sync(DdpCore& core, bool enabled) { core.grad_sync_ = enabled; }
bool grad_sync(const DdpCore& core) { return core.grad_sync_; }
DdpStats stats(const DdpCore& core) { return core.stats(); }

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
      "ddp: {} iterations, world {}, {} params in {} buckets ({:.2f} MiB{}), "
      "forward {:.2f} ms, backward compute {:.2f} ms, comm {:.2f} ms, exposed "
      "comm {:.2f} ms, buffer broadcast {:.2f} ms, unused {}",
      s.iterations, s.world_size, s.parameters, s.bucket_bytes.size(),
      s.gradient_bytes / double(1 << 20), s.buckets_rebuilt ? ", rebuilt" : "",
      s.forward_s * 1e3, s.backward_compute_s * 1e3, s.backward_comm_s * 1e3,
      s.exposed_comm_s * 1e3, s.buffer_broadcast_s * 1e3, s.unused_parameters_last);
}

}  // namespace ddp
