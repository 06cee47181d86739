// SyncBatchNorm: batch normalization whose batch statistics are those of the
// whole group's batch, as torch.nn.SyncBatchNorm; and convert_sync_batchnorm,
// which swaps the BatchNorm layers of a model for it.
//
//   auto net = torch::nn::Sequential(torch::nn::Conv2d(1, 8, 3),
//                                    torch::nn::BatchNorm2d(8), torch::nn::ReLU());
//   ddp::convert_sync_batchnorm(*net);           // before wrapping in DDP
//   ddp::DistributedDataParallel<torch::nn::Sequential> model(net);
//
// In training, forward reduces each channel's sum, sum of squares and count
// over the group (one all_reduce of 2C+1 float64 values), normalizes with
// the group's mean and biased variance, and updates the running statistics
// with the group's unbiased variance, as BatchNorm on the concatenated batch
// of every rank would. Backward reduces each channel's sum of the output
// gradient and of the output gradient times (x - mean) (one all_reduce of 2C
// float64 values) to form the input gradient; the weight and bias gradients
// are this rank's own, as in PyTorch, and DistributedDataParallel averages
// them. In eval mode the running statistics are used and nothing is
// communicated (without running statistics, this rank's batch statistics,
// as PyTorch).
//
// Better than PyTorch's: it runs on CPU tensors (PyTorch's SyncBatchNorm
// raises "SyncBatchNorm expected input tensor to be on GPU"); ranks may
// have different batch sizes, including 0 (an empty rank still joins both
// all_reduces and returns an empty output, so the others do not wait for
// it); and statistics are combined in float64. CUDA tensors take the same
// code (ATen operations that have CUDA kernels, all_reduce on the group's
// backend); their tests (tests/gpu_test.cc) have not yet passed on a GPU
// (docs/compat.md, "On a GPU").
//
// Shapes and dtypes: input N x C x * (at least 2 dimensions: 1d, 2d and 3d
// batch norm alike), floating point; output: the input's shape and dtype.
// weight/bias (when affine) and running_mean/running_var (when
// track_running_stats) are C-element tensors of the module's dtype;
// num_batches_tracked is an int64 scalar. Parameter and buffer names are
// BatchNorm's, so checkpoints move freely between BatchNorm and
// SyncBatchNorm.
//
// Collectives: in training mode with a group of more than one rank, each
// forward through the layer is a collective of the group, and so is each
// backward when the layer's input requires grad (as PyTorch: the input
// gradient needs the group's sums); every rank must run them, in the same
// order as the group's other collectives, or the others wait until the
// group's timeout. With one rank, or in eval mode, it is plain BatchNorm.
// float16/bfloat16 inputs are normalized in float32 and rounded once.
//
// Errors: InvalidArgument for an input of fewer than 2 dimensions or the
// wrong channel count (naming the layer and the input's shape) and, on every
// rank at once, when the whole group's batch has at most one value per
// channel in training; TimeoutError and CommError as all_reduce.
//
// Thread safety: as any torch::nn::Module; one layer belongs to one rank.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <ostream>

#include "ddp/process_group.h"

namespace ddp {

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // `options` as torch::nn::BatchNorm{1,2,3}d's (num_features, eps,
  // momentum, affine, track_running_stats); an unset momentum is the
  // cumulative moving average. `process_group`: the ranks whose batches
  // are normalized together; null: the default group at each forward, or
  // plain BatchNorm without one (Note [Null process group] in
  // process_group.h).
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                             ProcessGroupPtr process_group = nullptr);

  at::Tensor forward(const at::Tensor& input);

  // As BatchNorm's: (re)creates the parameters (weight 1, bias 0) and
  // buffers (running_mean 0, running_var 1, num_batches_tracked 0).
  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // Makes this layer use a BatchNorm's tensors: its weight and bias
  // themselves (so an optimizer built on the old layer's parameters keeps
  // working), and buffers that take the data (storage, dtype, device) of
  // its running_mean, running_var and num_batches_tracked (updates show in
  // both until either layer is moved with to()). Undefined tensors where
  // the options have none. Throws InvalidArgument, naming the tensor, when
  // one is missing, extra or of the wrong shape (C elements; a scalar for
  // num_batches_tracked). Used by convert_sync_batchnorm.
  void share_state(const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& running_mean, const at::Tensor& running_var,
                   const at::Tensor& num_batches_tracked);

  torch::nn::BatchNormOptions options;
  ProcessGroupPtr process_group;  // null: see the constructor
  at::Tensor weight, bias;                  // C elements; undefined unless affine
  at::Tensor running_mean, running_var;     // C elements; undefined unless tracked
  at::Tensor num_batches_tracked;           // int64 scalar; undefined unless tracked

 private:
  void check_input(const at::Tensor& input) const;
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm1d, BatchNorm2d and BatchNorm3d that is
// an element of a torch::nn::Sequential anywhere in `module`'s tree (a
// Sequential held by a field of your module, at any depth) by a SyncBatchNorm over `process_group` (null:
// the default group at each forward) with the same options, training mode and
// tensors (share_state). Call it before wrapping the model in
// DistributedDataParallel. Returns the number of layers replaced.
//
// libtorch difference: PyTorch's version reassigns attributes, which Python
// forward() looks up at each call. A libtorch module's forward() calls the
// layer objects it holds in its fields, which no function can swap. So only
// the elements of a torch::nn::Sequential (whose forward() goes through its
// element list) are replaced; a BatchNorm held by any other module
// (a field of your own module, a ModuleList or ModuleDict element, or
// `module` itself) is refused with InvalidArgument naming its path, before
// anything is changed: declare that layer as ddp::SyncBatchNorm instead.
int convert_sync_batchnorm(torch::nn::Module& module, ProcessGroupPtr process_group = nullptr);

}  // namespace ddp
