// PowerSGD hooks (powersgd.h), following PyTorch's powerSGD_hook.py step for
// step so that the same seed gives the same values.
#include "ddp/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_qr.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "ddp/error.h"

namespace ddp {
namespace {

// PyTorch's _orthogonalize_gram_schmidt over a batch [B, n, r], in place.
void gram_schmidt(const at::Tensor& m, double eps) {
  const int64_t cols = m.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = m.narrow(2, i, 1);
    at::Tensor norm = at::norm(col, 2, {1}, /*keepdim=*/true);
    col.div_(eps == 0 ? norm : norm + eps);
    if (i + 1 < cols) {
      at::Tensor rest = m.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// PyTorch's _orthogonalize: Gram-Schmidt for rank <= 2 or half precision,
// else QR. A 2-D matrix is a batch of one (see powersgd.h).
void orthogonalize(at::Tensor m, double eps) {
  if (m.dim() == 2) m = m.unsqueeze(0);
  const bool half = m.scalar_type() == at::kHalf || m.scalar_type() == at::kBFloat16;
  if (m.size(2) <= 2 || half) {
    gram_schmidt(m, eps);
  } else {
    m.copy_(std::get<0>(at::linalg_qr(m)));
  }
}

// Random Q on the CPU from a fresh generator seeded as PyTorch seeds its
// global one (fork_rng + manual_seed), then moved to the bucket's device.
at::Tensor fill_random(const at::Tensor& q, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(q.scalar_type())));
}

struct Compressible {
  std::vector<at::Tensor> matrices;  // [B, n, m] batches (views or stacks)
  std::vector<std::vector<at::Tensor>> originals;  // per stacked batch
};

}  // namespace

PowerSGDState::PowerSGDState(PowerSGDOptions options) : options_(options) {
  if ((options_.use_error_feedback || options_.warm_start) && options_.start_powerSGD_iter <= 1) {
    throw InvalidArgument(fmt::format(
        "PowerSGDState: start_powerSGD_iter is {}; it must be > 1 with use_error_feedback or "
        "warm_start, because the buckets are rebuilt after the first iteration (as in PyTorch)",
        options_.start_powerSGD_iter));
  }
  if (options_.matrix_approximation_rank < 1) {
    throw InvalidArgument(fmt::format("PowerSGDState: matrix_approximation_rank is {}; it must be >= 1",
                                      options_.matrix_approximation_rank));
  }
  rng_ = std::make_shared<std::mt19937>(options_.random_seed);
}

// numpy's legacy RandomState(seed).randint(10**9): MT19937 seeded like
// std::mt19937, 32-bit draws masked to 30 bits, rejected above the bound.
uint64_t PowerSGDState::next_seed() {
  auto& gen = *static_cast<std::mt19937*>(rng_.get());
  uint32_t v;
  do {
    v = static_cast<uint32_t>(gen()) & ((1u << 30) - 1);
  } while (v > 999999999u);
  return v;
}

void PowerSGDState::maybe_increase_iter(const GradBucket& bucket) {
  if (bucket.is_last) ++iter_;
}

bool PowerSGDState::compressing(const GradBucket& bucket) {
  if (iter_ >= options_.start_powerSGD_iter) return true;
  maybe_increase_iter(bucket);
  return false;
}

at::Tensor PowerSGDState::add_error(size_t k, at::Tensor& input) {
  if (!options_.use_error_feedback) return at::Tensor();
  auto it = error_.find(k);
  if (it != error_.end()) {
    input.add_(it->second);
  } else {
    error_[k] = at::zeros({input.numel()}, input.options());
  }
  return input.detach().clone();
}

void PowerSGDState::end_bucket(const GradBucket& bucket, const at::Tensor& corrected,
                               const at::Tensor& approximation) {
  const size_t k = bucket.index;
  if (options_.use_error_feedback) error_[k] = corrected - approximation;
  if (!options_.warm_start) {  // PyTorch clears both maps; each bucket its own entry
    p_memory_.erase(k);
    q_memory_.erase(k);
  }
  maybe_increase_iter(bucket);
}

PowerSGDState::CompressionStats PowerSGDState::compression_stats() const {
  CompressionStats s;
  s.numel_before = numel_before_;
  s.numel_after = numel_after_;
  s.rate = numel_after_ > 0 ? static_cast<double>(numel_before_) / numel_after_ : 0;
  return s;
}

namespace {

// PyTorch's split of a bucket: matrices worth compressing, grouped by shape
// in order of appearance, and the rest; counts the compression statistics.
struct Split {
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> by_shape;
  std::vector<at::Tensor> uncompressed;
  int64_t total_p = 0, total_q = 0;
};

Split split_gradients(const GradBucket& bucket, const PowerSGDOptions& o, int64_t& before_all,
                      int64_t& after_all) {
  Split s;
  for (const at::Tensor& t : bucket.gradients()) {
    if (t.dim() == 0) {  // a scalar parameter: nothing to factor
      s.uncompressed.push_back(t);
      before_all += 1;
      after_all += 1;
      continue;
    }
    at::Tensor matrix = t.view({t.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r = std::min<int64_t>({n, m, o.matrix_approximation_rank});
    const int64_t before = n * m, after = (n + m) * r;
    before_all += before;
    if (static_cast<double>(after) * o.min_compression_rate < static_cast<double>(before)) {
      auto shape = matrix.sizes().vec();
      auto it = std::find_if(s.by_shape.begin(), s.by_shape.end(),
                             [&](const auto& e) { return e.first == shape; });
      if (it == s.by_shape.end()) it = s.by_shape.insert(s.by_shape.end(), {shape, {}});
      it->second.push_back(matrix);
      s.total_p += n * r;
      s.total_q += m * r;
      after_all += after;
    } else {
      s.uncompressed.push_back(t);
      after_all += before;
    }
  }
  return s;
}

at::Tensor concat_or_empty(const std::vector<at::Tensor>& tensors, const at::TensorOptions& opts) {
  if (tensors.empty()) return at::empty({0}, opts);
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// PyTorch's maybe_batched_tensors_to_compress.
Compressible batch_matrices(const Split& s, bool stack_same_shape) {
  Compressible c;
  for (const auto& [shape, tensors] : s.by_shape) {
    if (stack_same_shape && tensors.size() > 1) {
      c.matrices.push_back(at::stack(tensors));
      c.originals.push_back(tensors);
    } else {
      for (const at::Tensor& t : tensors) {
        c.matrices.push_back(t.unsqueeze(0));
        c.originals.emplace_back();
      }
    }
  }
  return c;
}

// P [B, n, r] and Q [B, m, r] of each batch, views into the bucket's memory.
void pq_views(const Compressible& c, const at::Tensor& p_mem, const at::Tensor& q_mem, int rank,
              std::vector<at::Tensor>& ps, std::vector<at::Tensor>& qs) {
  int64_t p_at = 0, q_at = 0;
  for (const at::Tensor& t : c.matrices) {
    const int64_t b = t.size(0), n = t.size(1), m = t.size(2);
    const int64_t r = std::min<int64_t>({n, m, rank});
    ps.push_back(p_mem.narrow(0, p_at, b * n * r).view({b, n, r}));
    qs.push_back(q_mem.narrow(0, q_at, b * m * r).view({b, m, r}));
    p_at += b * n * r;
    q_at += b * m * r;
  }
}

// After the uncompressed tensors' all_reduce: their average back into the
// bucket, then P's all_reduce, Q = Mᵀ·P, Q's all_reduce, M ≈ P·Qᵀ.
struct Decompress {
  GradBucket bucket;
  std::vector<at::Tensor> uncompressed;
  std::vector<at::Tensor> ps, qs;  // views into p_mem and q_mem (pq_views)
  Compressible c;
  at::Tensor p_mem, q_mem;
  double epsilon = 0;

  void operator()(at::Tensor sum) {
    const int world = bucket.divisor;
    sum.div_(world);
    int64_t at = 0;
    for (const at::Tensor& t : uncompressed) {
      t.copy_(sum.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
    all_reduce(p_mem, ReduceOp::SUM, bucket.collective);
    for (const at::Tensor& p : ps) orthogonalize(p, epsilon);
    for (size_t i = 0; i < c.matrices.size(); ++i) {
      at::bmm_out(qs[i], c.matrices[i].transpose(1, 2), ps[i]);
    }
    all_reduce(q_mem, ReduceOp::SUM, bucket.collective);
    q_mem.div_(world);
    for (size_t i = 0; i < c.matrices.size(); ++i) {
      at::bmm_out(c.matrices[i], ps[i], qs[i].transpose(1, 2));
      for (size_t j = 0; j < c.originals[i].size(); ++j) c.originals[i][j].copy_(c.matrices[i][j]);
    }
  }
};

}  // namespace

BucketWork powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  const PowerSGDOptions& o = state.options_;
  if (!state.compressing(bucket)) return allreduce_hook(bucket);
  at::Tensor input = bucket.buffer;
  const size_t k = bucket.index;
  at::Tensor input_copy = state.add_error(k, input);
  Split split = split_gradients(bucket, o, state.numel_before_, state.numel_after_);
  at::Tensor flat_uncompressed = concat_or_empty(split.uncompressed, input.options());
  const bool randomize = !o.warm_start || !state.p_memory_.count(k);
  if (randomize) {
    state.p_memory_[k] = at::empty({split.total_p}, input.options());
    state.q_memory_[k] = at::empty({split.total_q}, input.options());
  }
  // The continuation holds this bucket's P and Q memory itself: without
  // warm_start another bucket's continuation may drop the map entries first.
  Decompress d;
  d.bucket = bucket;
  d.uncompressed = split.uncompressed;
  d.c = batch_matrices(split, o.batch_tensors_with_same_shape);
  d.p_mem = state.p_memory_[k];
  d.q_mem = state.q_memory_[k];
  d.epsilon = o.orthogonalization_epsilon;
  pq_views(d.c, d.p_mem, d.q_mem, o.matrix_approximation_rank, d.ps, d.qs);
  at::Generator gen;
  if (randomize) gen = at::detail::createCPUGenerator(state.next_seed());
  for (const at::Tensor& q : d.qs) {
    if (randomize) q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(q.scalar_type())));
    orthogonalize(q, o.orthogonalization_epsilon);
  }
  for (size_t i = 0; i < d.c.matrices.size(); ++i) at::bmm_out(d.ps[i], d.c.matrices[i], d.qs[i]);
  Work first = all_reduce_async(flat_uncompressed, ReduceOp::SUM, bucket.collective);
  PowerSGDState* st = &state;
  return BucketWork(std::move(first), flat_uncompressed)
      .then([st, d, input, input_copy](at::Tensor sum) mutable {
        d(std::move(sum));
        st->end_bucket(d.bucket, input_copy, input);
        return input;
      });
}

BucketWork batched_powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  const PowerSGDOptions& o = state.options_;
  if (!state.compressing(bucket)) return allreduce_hook(bucket);
  at::Tensor input = bucket.buffer;
  const int64_t total = input.numel();
  const int64_t side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(total))));
  const int64_t r = std::min<int64_t>(side, o.matrix_approximation_rank);
  state.numel_before_ += total;
  state.numel_after_ += side * r * 2;
  // PyTorch resizes the bucket buffer in place; ours is a view into the
  // reducer's bucket, so the padded matrix is a copy, written back at the end.
  at::Tensor padded = at::zeros({side * side}, input.options());
  padded.narrow(0, 0, total).copy_(input);
  const size_t k = bucket.index;
  at::Tensor padded_copy = state.add_error(k, padded);
  at::Tensor matrix = padded.view({side, side});
  if (!o.warm_start || !state.p_memory_.count(k)) {
    state.p_memory_[k] = at::empty({side, r}, input.options());
    at::Tensor q = at::empty({side, r}, input.options().device(at::kCPU));
    state.q_memory_[k] = fill_random(q, state.next_seed()).to(input.device());
  }
  // PyTorch's batched hook orthogonalises without orthogonalization_epsilon.
  at::Tensor p_mem = state.p_memory_[k], q_mem = state.q_memory_[k];
  orthogonalize(q_mem, 0);
  at::matmul_out(p_mem, matrix, q_mem);
  Work first = all_reduce_async(p_mem, ReduceOp::SUM, bucket.collective);
  PowerSGDState* st = &state;
  return BucketWork(std::move(first), p_mem)
      .then([st, bucket, matrix, padded, padded_copy, input, total,
             q = q_mem](at::Tensor p) mutable {
        orthogonalize(p, 0);
        at::matmul_out(q, matrix.t(), p);
        all_reduce(q, ReduceOp::SUM, bucket.collective);
        q.div_(bucket.divisor);
        at::matmul_out(matrix, p, q.t());
        st->end_bucket(bucket, padded_copy, padded);
        input.copy_(padded.narrow(0, 0, total));
        return input;
      });
}

}  // namespace ddp
