// The gradient half of a fully_shard unit (Note [Unit backward protocol] in
// fsdp_unit.h): packing, the reduce-scatter, the shards into .grad(), and
// the tree's ordering and end-of-backward callback.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>

#include "ddp/collectives_sharding.h"
#include "fsdp/fsdp_unit.h"

namespace ddp::detail {

// FSDP2's division of the gradient sum by world_size: for float32 and
// bfloat16, no risk of overflow: AVG, returned as {0, 1}. Otherwise (float16,
// float64) {pre, post}: divide by pre (a power of two near sqrt(world))
// before a SUM and by world / pre after it.
std::pair<double, double> divide_factors(at::ScalarType reduce_dtype, int64_t world) {
  if (reduce_dtype == at::kFloat || reduce_dtype == at::kBFloat16) return {0, 1};
  int64_t pre = 1;
  while (world % pre == 0 && world / pre > pre) pre *= 2;
  return {static_cast<double>(pre), static_cast<double>(world) / static_cast<double>(pre)};
}

void FsdpUnit::pack_grads() {
  at::NoGradGuard no_grad;
  phase_ = Phase::kPacked;
  needs_reduce_ = tree_->grad_sync && any_trainable();
  if (!needs_reduce_) {  // accumulate locally, full-sized, in the reduce dtype
    for (FsdpParam& p : params_) {
      at::Tensor g = p.param.grad();
      if (!g.defined()) continue;
      g = g.to(reduce_dtype_);
      p.unsynced_grad = p.unsynced_grad.defined() ? p.unsynced_grad.add_(g) : g;
      p.param.mutable_grad() = at::Tensor();
    }
    reshard();
    return;
  }
  const int64_t world = group_->size();
  reduce_input_ = at::zeros({world * shard_numel_}, flat_shard_.options().dtype(reduce_dtype_));
  at::Tensor by_rank = reduce_input_.view({world, shard_numel_});
  for (FsdpParam& p : params_) {
    at::Tensor g = p.param.grad();
    if (p.unsynced_grad.defined()) {  // summed in the reduce dtype, as FSDP2
      g = g.defined() ? p.unsynced_grad.add_(g.to(reduce_dtype_)) : p.unsynced_grad;
    }
    p.unsynced_grad = at::Tensor();
    p.param.mutable_grad() = at::Tensor();
    const ParamShard& l = p.layout;
    if (!g.defined() || l.row_numel == 0 || l.rows == 0) continue;  // zeros
    // Rank r's rows of this parameter go to column block l.offset of row r.
    for (int64_t r = 0; r < world; ++r) {
      const int64_t first = r * l.chunk_rows;
      const int64_t n = std::min(l.chunk_rows, l.rows - first);
      if (n <= 0) break;
      by_rank[r].narrow(0, l.offset, n * l.row_numel)
          .view({n, l.row_numel})
          .copy_(g.reshape({l.rows, l.row_numel}).narrow(0, first, n));
    }
  }
  if (const double pre = divide_factors(reduce_dtype_, world).first; pre > 1) {
    reduce_input_.div_(pre);
  }
  reshard();
}

void FsdpUnit::issue_reduce() {
  phase_ = Phase::kIssued;
  if (!needs_reduce_) return;
  reduced_ = at::empty({shard_numel_}, reduce_input_.options());
  const bool average = divide_factors(reduce_dtype_, group_->size()).first == 0;
  const ReduceOp op = average ? ReduceOp::AVG : ReduceOp::SUM;
  if (shard_numel_ > 0) reduce_work_ = reduce_scatter_tensor_async(reduced_, reduce_input_, op, {group_});
}

void FsdpUnit::finish_reduce() {
  if (phase_ != Phase::kIssued) return;
  phase_ = Phase::kIdle;
  if (!needs_reduce_) return;
  if (shard_numel_ > 0) reduce_work_.wait();
  reduce_work_ = Work();
  reduce_input_ = at::Tensor();
  at::NoGradGuard no_grad;
  if (const double post = divide_factors(reduce_dtype_, group_->size()).second; post != 1) {
    reduced_.div_(post);
  }
  if (reduced_.scalar_type() != own_dtype_) reduced_ = reduced_.to(own_dtype_);
  for (FsdpParam& p : params_) {
    if (!p.param.requires_grad()) continue;
    const ParamShard& l = p.layout;
    at::Tensor piece = reduced_.narrow(0, l.offset, l.local_numel()).view(l.shard_sizes);
    at::Tensor& grad = p.param.mutable_grad();
    // Accumulates as AccumulateGrad would into an existing gradient. Not a
    // view of the buffer: Optimizer::zero_grad detaches gradients in place,
    // which views refuse.
    grad = grad.defined() ? grad.add_(piece) : piece.clone();
  }
  reduced_ = at::Tensor();
}

at::Tensor FsdpUnit::gather_full(size_t index) {
  std::lock_guard<std::recursive_mutex> lock(tree_->mu);
  const FsdpParam& p = params_[index];
  return gather_rows(p.layout, p.shard, group_);
}

at::Tensor gather_rows(const ParamShard& l, const at::Tensor& local,
                       const ProcessGroupPtr& group) {
  const int64_t world = group->size();
  at::NoGradGuard no_grad;
  if (l.padded_numel() == 0) return at::zeros(l.full_sizes, local.options());
  at::Tensor in = at::zeros({l.padded_numel()}, local.options());
  in.narrow(0, 0, l.local_numel()).copy_(local.reshape({-1}));
  at::Tensor out = at::empty({world * l.padded_numel()}, local.options());
  all_gather_into_tensor(out, in, {group});
  return out.view({world * l.chunk_rows, l.row_numel})
      .narrow(0, 0, l.rows)
      .reshape(l.full_sizes)
      .clone();
}

at::Tensor local_rows(const ParamShard& l, const at::Tensor& full, int rank) {
  at::NoGradGuard no_grad;
  if (l.local_numel() == 0) return at::zeros(l.shard_sizes, full.options());
  return full.reshape({l.rows, l.row_numel})
      .narrow(0, rank * l.chunk_rows, l.local_rows)
      .reshape(l.shard_sizes)
      .clone();
}

void FsdpTree::queue_end_of_backward() {
  if (callback_queued) return;
  callback_queued = true;
  // The units keep the tree alive; the callback runs before backward()
  // returns, while they are.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
}

void FsdpTree::end_of_backward() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  callback_queued = false;
  // Units whose post-backward did not come, in the order their backwards
  // began: what they have, zeros for the rest.
  for (const auto& u : backward_order) {
    if (u->in_backward()) u->pack_grads();
    if (u->packed()) u->issue_reduce();
  }
  std::vector<std::shared_ptr<FsdpUnit>> done;
  done.swap(backward_order);
  // Every unit's parameters back to shards before the shard gradients land.
  reshard_all();
  for (const auto& u : done) u->finish_reduce();
}

void FsdpTree::drop_gathers() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (const auto& w : units) {
    if (auto u = w.lock()) u->drop_gather();
  }
}

void FsdpTree::reshard_all() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (const auto& w : units) {
    if (auto u = w.lock()) {
      u->reshard();
      u->reset_backward_counts();
    }
  }
}

}  // namespace ddp::detail
