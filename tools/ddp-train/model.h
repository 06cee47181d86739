// The Fashion-MNIST CNN of ddp-train: two convolution blocks with
// BatchNorm, dropout, two fully connected layers (the "2 conv + 2 FC"
// architecture whose published accuracy is about 92.5%). With sync_bn the
// two BatchNorm layers are ddp::SyncBatchNorm (statistics over every rank's
// batch); the parameter and buffer names are the same either way, so
// checkpoints move between the two.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace ddp::train {

// Input: N x 1 x 28 x 28 float32. Output: N x 10 logits.
struct FashionCnnImpl : torch::nn::Module {
  explicit FashionCnnImpl(bool sync_bn = false);
  at::Tensor forward(at::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  // torch::nn::BatchNorm2d or ddp::SyncBatchNorm (a field's type is fixed
  // at compile time: convert_sync_batchnorm cannot swap it).
  torch::nn::AnyModule bn1, bn2;
  torch::nn::Dropout drop1{nullptr}, drop2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(FashionCnn);

}  // namespace ddp::train
