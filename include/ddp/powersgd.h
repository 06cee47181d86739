// PowerSGD gradient compression as a comm hook (comm_hooks.h): PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook (Vogels et al.,
// NeurIPS 2019), with the same options, the same random numbers for a given
// seed, and the same values.
//
//   ddp::PowerSGDOptions o;
//   o.matrix_approximation_rank = 2;
//   o.start_powerSGD_iter = 10;
//   auto state = std::make_shared<ddp::PowerSGDState>(o);
//   model.register_comm_hook(state, ddp::powerSGD_hook, "powerSGD");
//
// Per bucket, from iteration start_powerSGD_iter on (before it: the plain
// all_reduce, which the buckets' rebuild after the first iteration needs):
//   1. with use_error_feedback, the previous iteration's compression error is
//      added to the gradients;
//   2. each gradient is viewed as a matrix (first dimension x the rest). If
//      rank·(rows+cols)·min_compression_rate < rows·cols it is compressed:
//      P = M·Q is all-reduced, orthogonalised, Q = Mᵀ·P all-reduced and
//      divided, M ≈ P·Qᵀ. The others (biases, small layers) are all-reduced
//      as they are, in one tensor. Q starts random (seeded, one draw per
//      bucket as PyTorch: numpy's RandomState(random_seed).randint(10⁹)
//      seeds torch's generator) and, with warm_start, is reused.
// Three all_reduces per bucket instead of one, of (rows+cols)·rank elements
// per compressed matrix instead of rows·cols.
//
// batched_powerSGD_hook compresses the whole bucket as one square matrix
// (its length rounded up to a square): fewer, larger products, less accurate.
// (PyTorch 2.13's batched hook raises AssertionError once compression
// starts: it passes a 2-D Q to an orthogonalisation that wants 3-D; here it
// works, orthogonalising the matrix as a batch of one, as PyTorch intended.)
//
// Threading: a state belongs to one wrapper; not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>

#include "ddp/comm_hooks.h"

namespace ddp {

// PowerSGDState's constructor arguments, PyTorch's names and defaults.
struct PowerSGDOptions {
  // Rank r of the approximation; per matrix min(rows, cols, r).
  int matrix_approximation_rank = 1;
  // Iterations (backward passes) of plain all_reduce before compressing.
  // Must be > 1 with use_error_feedback or warm_start (InvalidArgument).
  int64_t start_powerSGD_iter = 1000;
  // A matrix is compressed only when its size shrinks by more than this.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  // Added to each column norm in the orthogonalisation (0: none; a column
  // of zeros then gives NaN, as in PyTorch; 1e-8 avoids it). The batched
  // hook ignores it, as PyTorch's does.
  double orthogonalization_epsilon = 0;
  uint32_t random_seed = 0;
  // Stack same-shaped matrices of a bucket into one batched product.
  bool batch_tensors_with_same_shape = false;
};

class PowerSGDState {
 public:
  // Throws InvalidArgument for start_powerSGD_iter <= 1 with error feedback
  // or warm start, or matrix_approximation_rank < 1.
  explicit PowerSGDState(PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  // Backward passes the hook has completed (PyTorch's state.iter).
  int64_t iteration() const { return iter_; }
  // PyTorch's compression_stats(): elements before and after compression
  // over all compressed iterations, and their ratio (0 before any).
  struct CompressionStats {
    double rate = 0;
    int64_t numel_before = 0, numel_after = 0;
  };
  CompressionStats compression_stats() const;

 private:
  friend BucketWork powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
  friend BucketWork batched_powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
  // The next seed for torch's generator (numpy's RandomState.randint(10⁹)).
  uint64_t next_seed();
  void maybe_increase_iter(const GradBucket& bucket);
  // The steps both hooks share, in PyTorch's order. compressing(): false
  // (the iteration counted) while before start_powerSGD_iter, when the hook
  // all-reduces plainly. add_error(): with use_error_feedback, adds bucket
  // k's previous compression error to `input` (zero the first time) and
  // returns the corrected input (undefined without error feedback).
  // end_bucket(): keeps the new error (corrected - approximation), drops
  // P and Q without warm_start, and counts the iteration at its last bucket.
  bool compressing(const GradBucket& bucket);
  at::Tensor add_error(size_t k, at::Tensor& input);
  void end_bucket(const GradBucket& bucket, const at::Tensor& corrected,
                  const at::Tensor& approximation);

  PowerSGDOptions options_;
  std::shared_ptr<void> rng_;  // std::mt19937, kept out of this header
  std::map<size_t, at::Tensor> error_, p_memory_, q_memory_;  // by bucket index
  int64_t iter_ = 0;
  int64_t numel_before_ = 0, numel_after_ = 0;
};

// The hooks: register with model.register_comm_hook(state, hook, name).
BucketWork powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
BucketWork batched_powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace ddp
