// The Fashion-MNIST CNN of ddp-train: two convolution blocks with
// BatchNorm, dropout, two fully connected layers (the "2 conv + 2 FC"
// architecture whose published accuracy is about 92.5%). With sync_bn the
// two BatchNorm layers are ddp::SyncBatchNorm (statistics over every rank's
// batch); the parameter and buffer names are the same either way, so
// checkpoints move between the two.
//
// The two convolutions and the two linear layers are fully_shard units
// (ddp::FullyShard<...>) and the CNN itself is one: until ddp::fully_shard
// is called on them they are exactly the plain modules (DDP trains them as
// such); ddp-train --fully-shard shards the four layers, then the CNN,
// whose own parameters are the two BatchNorms' (Note [Units are wrapper
// types] in ddp/fully_shard.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "ddp/fully_shard.h"

namespace ddp::train {

// Input: N x 1 x 28 x 28 float32. Output: N x 10 logits.
struct FashionCnnImpl : torch::nn::Module {
  explicit FashionCnnImpl(bool sync_bn = false);
  at::Tensor forward(at::Tensor x);

  ddp::FullyShard<torch::nn::Conv2dImpl> conv1{nullptr}, conv2{nullptr};
  // torch::nn::BatchNorm2d or ddp::SyncBatchNorm (a field's type is fixed
  // at compile time: convert_sync_batchnorm cannot swap it).
  torch::nn::AnyModule bn1, bn2;
  torch::nn::Dropout drop1{nullptr}, drop2{nullptr};
  ddp::FullyShard<torch::nn::LinearImpl> fc1{nullptr}, fc2{nullptr};
};
using FashionCnn = ddp::FullyShard<FashionCnnImpl>;

// ddp-train --fully-shard: the four layers, then the CNN (the root), each
// over the default group.
void fully_shard_cnn(FashionCnn& net);

}  // namespace ddp::train
