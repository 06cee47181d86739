#include "fsdp/fsdp_unit.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/collectives_sharding.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<FsdpUnit> unit, size_t index, void (FsdpUnit::*fn)(size_t))
      : unit_(std::move(unit)), index_(index), fn_(fn) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto u = unit_.lock()) ((*u).*fn_)(index_);
    return outputs;
  }

 private:
  std::weak_ptr<FsdpUnit> unit_;
  size_t index_;
  void (FsdpUnit::*fn_)(size_t);
};

// A parameter's rows as [rows, row_numel] (a 0-dim one as [1, 1]).
at::Tensor as_rows(const at::Tensor& t, const ParamShard& l) {
  return t.reshape({l.rows, l.row_numel});
}

}  // namespace

std::shared_ptr<FsdpUnit> FsdpUnit::create(std::string unit_name,
                                           std::vector<std::pair<std::string, at::Tensor>> params,
                                           const FullyShardOptions& options) {
  std::shared_ptr<FsdpUnit> unit(new FsdpUnit(std::move(unit_name), std::move(params), options));
  unit->install_hooks();
  return unit;
}

FsdpUnit::FsdpUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params,
                   const FullyShardOptions& options)
    : name_(std::move(name)), options_(options), group_(options.group) {
  if (!group_) group_ = default_group();
  if (!group_) {
    throw InvalidArgument(fmt::format(
        "fully_shard({}): no process group: call ddp::init_process_group() first or pass "
        "FullyShardOptions::group",
        name_));
  }
  std::vector<std::vector<int64_t>> sizes;
  for (const auto& [pname, t] : params) {
    const at::Tensor& first = params.front().second;
    if (t.scalar_type() != first.scalar_type() || t.device() != first.device()) {
      throw InvalidArgument(fmt::format(
          "fully_shard({}): parameter '{}' is {} on {} but '{}' is {} on {}: a unit's "
          "parameters share one dtype and device (shard the odd ones in a unit of their own)",
          name_, pname, c10::toString(t.scalar_type()), t.device().str(),
          params.front().first, c10::toString(first.scalar_type()), first.device().str()));
    }
    sizes.push_back(t.sizes().vec());
  }
  const UnitShardLayout layout = unit_shard_layout(sizes, group_->rank(), group_->size());
  shard_numel_ = layout.shard_numel;
  at::TensorOptions opts =
      params.empty() ? at::TensorOptions(at::kFloat) : params.front().second.options();
  opts = opts.requires_grad(false);
  flat_shard_ = at::zeros({shard_numel_}, opts);
  // FSDP2's clamping: a param_dtype equal to the own dtype (or for
  // non-floating parameters) is none; the reduce dtype defaults to the
  // computation's.
  const MixedPrecisionPolicy& mp = options_.mp_policy;
  own_dtype_ = c10::typeMetaToScalarType(opts.dtype());
  compute_dtype_ = mp.param_dtype && at::isFloatingType(own_dtype_) ? *mp.param_dtype : own_dtype_;
  reduce_dtype_ = mp.reduce_dtype ? *mp.reduce_dtype : compute_dtype_;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    FsdpParam p;
    p.name = params[i].first;
    p.param = params[i].second;
    p.layout = layout.params[i];
    const ParamShard& l = p.layout;
    const int64_t first_row = group_->rank() * l.chunk_rows;
    at::Tensor full = p.param.detach();
    p.full = at::empty(l.full_sizes, opts.dtype(compute_dtype_));
    p.shard = flat_shard_.narrow(0, l.offset, l.local_numel()).view(l.shard_sizes);
    if (l.local_numel() > 0) {
      p.shard.view({l.local_rows, l.row_numel})
          .copy_(as_rows(full, l).narrow(0, first_row, l.local_rows));
    }
    at::Tensor grad = p.param.grad();
    if (grad.defined()) {
      p.param.mutable_grad() =
          as_rows(grad, l).narrow(0, first_row, l.local_rows).reshape(l.shard_sizes).clone();
    }
    params_.push_back(std::move(p));
  }
}

void FsdpUnit::install_hooks() {
  sync_hooks();
  for (FsdpParam& p : params_) {
    assign_data(p, p.shard);
    release_storage(p.full);
    put_version_aside(p);
  }
}

std::optional<at::ScalarType> FsdpUnit::input_dtype() const {
  if (!options_.mp_policy.cast_forward_inputs || compute_dtype_ == own_dtype_) return std::nullopt;
  return compute_dtype_;
}

// A hook on the grad accumulator of every parameter that requires grad now
// (requires_grad may change between iterations). Only while the parameters
// are full-sized: Note [Shard and full in one parameter].
void FsdpUnit::sync_hooks() {
  std::weak_ptr<FsdpUnit> self = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    FsdpParam& p = params_[i];
    if (p.param.requires_grad() && !p.accumulator) {
      p.accumulator = torch::autograd::impl::grad_accumulator(p.param);
      p.hook_key = p.accumulator->add_post_hook(
          std::make_unique<GradReadyHook>(self, i, &FsdpUnit::on_grad_ready));
    } else if (!p.param.requires_grad() && p.accumulator) {
      p.accumulator->del_post_hook(p.hook_key);
      p.accumulator = nullptr;
    }
  }
}

bool FsdpUnit::any_trainable() const {
  for (const FsdpParam& p : params_) {
    if (p.param.requires_grad()) return true;
  }
  return false;
}

FsdpUnit::~FsdpUnit() {
  for (FsdpParam& p : params_) {
    if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
  }
}

bool FsdpUnit::is_root() const {
  return tree_ && !tree_->units.empty() && tree_->units.back().lock().get() == this;
}

void FsdpUnit::pre_forward(const std::vector<at::Tensor>& inputs) {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (is_root()) {  // Note [Prefetching]: a whole forward, recorded
    tree_->in_forward = true;
    tree_->recording_begin.clear();
    tree_->recording_end.clear();
  }
  unshard();
  if (tree_->in_forward) {
    tree_->recording_begin.push_back(weak_from_this());
    prefetch_next(tree_->forward_order);
  }
  if (!at::GradMode::is_enabled()) return;
  // Note [Unit backward protocol]: the unit's backward is over when the
  // gradients of its inputs are computed.
  std::weak_ptr<FsdpUnit> self = weak_from_this();
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([self](at::Tensor) {
      if (auto u = self.lock()) u->post_backward();
    });
    ++post_backward_expected_;
  }
}

void FsdpUnit::post_forward(const std::vector<at::Tensor>& outputs, bool outputs_known) {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (tree_->in_forward) tree_->recording_end.push_back(weak_from_this());
  if (is_root() && tree_->in_forward) {
    tree_->in_forward = false;
    tree_->forward_order = std::move(tree_->recording_begin);
    tree_->backward_prefetch_order.assign(tree_->recording_end.rbegin(),
                                          tree_->recording_end.rend());
    tree_->recording_begin.clear();
    tree_->recording_end.clear();
    tree_->drop_gathers();  // issued for units that did not run
  }
  if (!at::GradMode::is_enabled()) {
    reshard();  // no backward comes through this unit
    return;
  }
  if (!outputs_known) {
    reshard();
    throw InvalidArgument(fmt::format(
        "fully_shard({}): cannot see the tensors of forward's output type, so its backward "
        "cannot be hooked: define collect_tensors(const YourOutput&, "
        "std::vector<at::Tensor>&) in the output type's namespace",
        name_));
  }
  std::weak_ptr<FsdpUnit> self = weak_from_this();
  bool hooked = false;
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([self](at::Tensor) {
      if (auto u = self.lock()) u->pre_backward();
    });
    hooked = true;
  }
  if (!hooked || (options_.reshard_after_forward && !is_root())) reshard();
}

void FsdpUnit::pre_backward() {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (phase_ == Phase::kInBackward) return;
  phase_ = Phase::kInBackward;
  tree_->queue_end_of_backward();
  tree_->backward_order.push_back(shared_from_this());
  // The shard gradients wait while autograd accumulates full-sized ones.
  if (!grads_stashed_) {
    for (FsdpParam& p : params_) {
      p.stashed_grad = p.param.grad();
      p.param.mutable_grad() = at::Tensor();
    }
    grads_stashed_ = true;
  }
  unshard();
  prefetch_next(tree_->backward_prefetch_order);
}

void FsdpUnit::post_backward() {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  ++post_backward_seen_;
  if (phase_ == Phase::kInBackward && post_backward_seen_ >= post_backward_expected_) {
    pack_grads();
    issue_reduce();
  }
}

void FsdpUnit::reset_backward_counts() {
  post_backward_expected_ = 0;
  post_backward_seen_ = 0;
}

void FsdpUnit::on_grad_ready(size_t index) {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (phase_ == Phase::kInBackward) return;
  const FsdpParam& p = params_[index];
  if (phase_ == Phase::kIdle) {
    throw InvalidArgument(fmt::format(
        "fully_shard({}): parameter '{}' got a gradient outside the unit's backward: it "
        "was used outside the unit's forward (a parameter of a unit is only gathered "
        "inside that unit's forward; move the use into it or into a unit containing both)",
        name_, p.name));
  }
  throw InvalidArgument(fmt::format(
      "fully_shard({}): parameter '{}' got its gradient after the unit's backward was over "
      "(its inputs' gradients were computed and its gradients reduced): it was also used "
      "outside the unit's forward, e.g. in a tensor kept aside rather than returned; "
      "return what the loss needs from the unit's forward, or shard a unit containing both "
      "uses",
      name_, p.name));
}

}  // namespace ddp::detail
