#include "model.h"

#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/relu.h>

namespace ddp::train {

FashionCnnImpl::FashionCnnImpl() {
  namespace nn = torch::nn;
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)));
  bn1 = register_module("bn1", nn::BatchNorm2d(32));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
  bn2 = register_module("bn2", nn::BatchNorm2d(64));
  drop1 = register_module("drop1", nn::Dropout(0.25));
  fc1 = register_module("fc1", nn::Linear(64 * 7 * 7, 128));
  drop2 = register_module("drop2", nn::Dropout(0.5));
  fc2 = register_module("fc2", nn::Linear(128, 10));
}

at::Tensor FashionCnnImpl::forward(at::Tensor x) {
  x = at::max_pool2d(at::relu(bn1(conv1(x))), {2, 2});  // 32 x 14 x 14
  x = at::max_pool2d(at::relu(bn2(conv2(x))), {2, 2});  // 64 x 7 x 7
  x = drop1(x).flatten(1);
  x = drop2(at::relu(fc1(x)));
  return fc2(x);
}

}  // namespace ddp::train
