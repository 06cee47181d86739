// Internal: which parameters share a bucket (one flat all_reduce).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace ddp::detail {

struct BucketParamInfo {
  int64_t bytes = 0;  // numel * element size
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
};

// Groups parameters into buckets, following PyTorch's
// compute_bucket_assignment_by_size:
//   - parameters are taken in `order` (indices into `params`);
//   - each (dtype, device) pair fills its own open bucket; a bucket closes
//     once its size reaches the current limit, so a parameter larger than
//     the limit gets a bucket of its own;
//   - the first bucket closed for a (dtype, device) pair uses
//     limits_bytes[0], the next limits_bytes[1], and so on, the last limit
//     repeating;
//   - buckets are returned in the order of their first parameter in `order`,
//     parameters within a bucket in `order`.
// limits_bytes must be non-empty and positive; `order` a permutation of
// 0..params.size()-1 (both checked by the caller).
std::vector<std::vector<size_t>> compute_bucket_assignment(
    const std::vector<BucketParamInfo>& params, const std::vector<size_t>& order,
    const std::vector<int64_t>& limits_bytes);

}  // namespace ddp::detail
