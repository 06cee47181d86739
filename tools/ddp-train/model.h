// The Fashion-MNIST CNN of ddp-train: two convolution blocks with
// BatchNorm, dropout, two fully connected layers (the "2 conv + 2 FC"
// architecture whose published accuracy is about 92.5%).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace ddp::train {

// Input: N x 1 x 28 x 28 float32. Output: N x 10 logits.
struct FashionCnnImpl : torch::nn::Module {
  FashionCnnImpl();
  at::Tensor forward(at::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Dropout drop1{nullptr}, drop2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(FashionCnn);

}  // namespace ddp::train
