// The parameter half of a fully_shard unit: how one parameter tensor holds
// its shard or its full value (Note [Shard and full in one parameter], Note
// [Mixed precision in one parameter] in fsdp_unit.h), the all-gathers
// (issued ahead or not: Note [Prefetching]) and the reshard.
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/collectives_sharding.h"
#include "ddp/error.h"
#include "fsdp/fsdp_unit.h"

namespace ddp::detail {

// Note [Shard and full in one parameter]: the full tensor's StorageImpl
// outlives each gather; only its bytes come and go.
void release_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// Note [Shard and full in one parameter]: the stand-in version counter.
void put_version_aside(FsdpParam& p) {
  if (p.real_version) return;
  p.real_version = torch::autograd::impl::version_counter(p.param);
  torch::autograd::impl::set_version_counter(
      p.param, c10::VariableVersion(p.real_version->current_version() + 1));
}

void restore_version(FsdpParam& p) {
  if (!p.real_version) return;
  const uint32_t changes =
      torch::autograd::impl::version_counter(p.param).current_version() -
      (p.real_version->current_version() + 1);
  c10::VariableVersion real = *p.real_version;
  for (uint32_t i = 0; i < changes; ++i) real.bump();
  torch::autograd::impl::set_version_counter(p.param, real);
  p.real_version.reset();
}

// Note [Mixed precision in one parameter].
void FsdpUnit::assign_data(FsdpParam& p, const at::Tensor& data) {
  if (data.scalar_type() == p.param.scalar_type()) {
    p.param.set_data(data);
  } else {
    p.param.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  }
}

void FsdpUnit::check_holds_shard() const {
  for (const FsdpParam& p : params_) {
    // Module::to(), set_data() or a state dict loaded into the module give
    // the parameter new data the gathers would never see.
    if (p.param.storage().unsafeGetStorageImpl() != flat_shard_.storage().unsafeGetStorageImpl()) {
      throw InvalidArgument(fmt::format(
          "fully_shard({}): parameter '{}' no longer holds its shard (its data was replaced "
          "after fully_shard: Module::to(), set_data(), or a state dict loaded into the "
          "module): move the model and load its values before fully_shard, or use "
          "ddp::load_full_state_dict",
          name_, p.name));
    }
  }
}

void FsdpUnit::begin_unshard() {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (unsharded_ || gather_pending_) return;
  check_holds_shard();
  at::NoGradGuard no_grad;
  // With a param_dtype the shard is cast first: the all-gather moves it.
  gather_input_ = flat_shard_.to(compute_dtype_);
  gathered_ = at::empty({group_->size() * shard_numel_}, gather_input_.options());
  if (shard_numel_ > 0) {
    // An all-gather only moves bytes: 16-bit floats travel as bytes, which
    // every backend gathers (Gloo before PyTorch 2 has no bfloat16).
    const bool half = gather_input_.element_size() == 2 && gather_input_.is_floating_point();
    at::Tensor out = half ? gathered_.view(at::kByte) : gathered_;
    gather_work_ = all_gather_into_tensor_async(
        out, half ? gather_input_.view(at::kByte) : gather_input_, {group_});
  }
  gather_pending_ = true;
}

void FsdpUnit::drop_gather() {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  if (!gather_pending_) return;
  ++prefetches_dropped_;
  if (shard_numel_ > 0) gather_work_.wait();
  gather_work_ = Work();
  gather_input_ = gathered_ = at::Tensor();
  gather_pending_ = false;
}

void FsdpUnit::unshard() {
  if (unsharded_) return;
  if (gather_pending_) ++prefetches_used_;
  begin_unshard();  // unless issued ahead (Note [Prefetching])
  finish_unshard();
}

void FsdpUnit::finish_unshard() {
  if (shard_numel_ > 0) gather_work_.wait();
  gather_work_ = Work();
  gather_pending_ = false;
  const int64_t world = group_->size();
  at::NoGradGuard no_grad;
  at::Tensor by_rank = gathered_.view({world, shard_numel_});
  for (FsdpParam& p : params_) {
    const ParamShard& l = p.layout;
    allocate_storage(p.full);
    if (l.row_numel > 0 && l.rows > 0) {
      at::Tensor pieces = by_rank.narrow(1, l.offset, l.padded_numel())
                              .reshape({world * l.chunk_rows, l.row_numel})
                              .narrow(0, 0, l.rows);
      p.full.view({l.rows, l.row_numel}).copy_(pieces);
    }
    assign_data(p, p.full);
    restore_version(p);
    p.version_at_gather = p.param._version();
  }
  gather_input_ = gathered_ = at::Tensor();
  unsharded_ = true;
  sync_hooks();
}

void FsdpUnit::prefetch_next(const std::vector<std::weak_ptr<FsdpUnit>>& order) {
  if (!options_.prefetch) return;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    if (order[i].lock().get() != this) continue;
    if (auto next = order[i + 1].lock()) next->begin_unshard();
    return;
  }
}

void FsdpUnit::reshard() {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  drop_gather();
  if (!unsharded_) return;
  for (const FsdpParam& p : params_) {
    if (p.param._version() != p.version_at_gather) {
      throw InvalidArgument(fmt::format(
          "fully_shard({}): parameter '{}' was changed in place while gathered (an "
          "optimizer step between forward and backward?): step the optimizer after "
          "backward, when the parameters are shards",
          name_, p.name));
    }
  }
  for (FsdpParam& p : params_) {
    if (grads_stashed_) p.param.mutable_grad() = p.stashed_grad;
    p.stashed_grad = at::Tensor();
    assign_data(p, p.shard);
    release_storage(p.full);
    put_version_aside(p);
  }
  unsharded_ = false;
  grads_stashed_ = false;
}

}  // namespace ddp::detail
