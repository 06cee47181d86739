// A batch of examples as stacked tensors: what FashionMnist::get_batch and
// BatchLoader yield. The field names follow torch::data::Example (data,
// target); this header avoids torch/data's heavy includes.
#pragma once

#include <ATen/core/Tensor.h>

namespace ddp {
namespace datasets {

struct Batch {
  // Inputs, first dimension the batch (e.g. N x 1 x 28 x 28 float32).
  at::Tensor data;
  // Targets, first dimension the batch (e.g. N int64 class indices).
  at::Tensor target;
};

}  // namespace datasets
}  // namespace ddp
