// compute_bucket_assignment: PyTorch's size-capped bucketing per (dtype,
// device), first bucket smaller, buckets in order of their first parameter.
#include "reducer/bucket_assignment.h"

#include <gtest/gtest.h>

namespace ddp::detail {
namespace {

using V = std::vector<std::vector<size_t>>;

BucketParamInfo f32(int64_t numel) { return {numel * 4, c10::kFloat, c10::Device(c10::kCPU)}; }
BucketParamInfo f64(int64_t numel) { return {numel * 8, c10::kDouble, c10::Device(c10::kCPU)}; }

TEST(BucketAssignment, FirstBucketSmallerThenCap) {
  std::vector<BucketParamInfo> p = {f32(10), f32(10), f32(10), f32(10), f32(10)};
  std::vector<size_t> order = {4, 3, 2, 1, 0};  // reverse registration order
  // First bucket closes at >= 40 bytes (one param), later at >= 80 (two).
  EXPECT_EQ(compute_bucket_assignment(p, order, {40, 80}), (V{{4}, {3, 2}, {1, 0}}));
}

TEST(BucketAssignment, LargeParameterGetsItsOwnBucket) {
  std::vector<BucketParamInfo> p = {f32(1), f32(1000), f32(1)};
  EXPECT_EQ(compute_bucket_assignment(p, {0, 1, 2}, {100, 100}), (V{{0, 1}, {2}}));
}

TEST(BucketAssignment, DtypesNeverShareABucket) {
  std::vector<BucketParamInfo> p = {f32(4), f64(4), f32(4), f64(4)};
  EXPECT_EQ(compute_bucket_assignment(p, {3, 2, 1, 0}, {1 << 20}), (V{{3, 1}, {2, 0}}));
}

TEST(BucketAssignment, FollowsTheGivenOrder) {
  std::vector<BucketParamInfo> p = {f32(10), f32(10), f32(10)};
  EXPECT_EQ(compute_bucket_assignment(p, {1, 0, 2}, {80}), (V{{1, 0}, {2}}));
}

}  // namespace
}  // namespace ddp::detail
