// Internal: how a message shows a tensor. This is the one format of every
// message, error and fingerprint in ddp that names a tensor or a dtype:
// PyTorch's dtype name and the sizes, "float32[16, 8]" ("float32[]" for a
// scalar), and a dtype alone as "float32" (torch.float32 without "torch.").
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace ddp::detail {

// PyTorch's name of a dtype: float32, float64, float16, bfloat16, int64,
// int32, int16, int8, uint8, bool, complex64, complex128; c10's name
// (c10::toString) for any other.
std::string dtype_name(c10::ScalarType type);

// "float32[16, 8]"; "float32[]" for a scalar; "undefined" for an undefined
// tensor.
std::string describe_tensor(const at::Tensor& t);

// describe_tensor of each, separated by spaces: "float32[4] int64[2, 3]"
// (debug-mode fingerprints, collective descriptions).
std::string describe_tensors(const std::vector<at::Tensor>& tensors);

}  // namespace ddp::detail
