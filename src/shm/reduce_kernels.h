// The element-wise reductions of the shared-memory all-reduce.
//
// reduce() combines n input arrays element by element, always in the order
// srcs[0], srcs[1], ..., srcs[n-1], so that every rank computing the same
// slice gets bitwise the same result (Note [Shared-memory all-reduce]).
// float16 and bfloat16 are widened to float32 for the arithmetic and
// rounded once at the end. The float kernels are compiled for AVX-512, AVX2
// and the baseline, chosen at run time by the CPU (GCC's target_clones).
#pragma once

#include <cstddef>

namespace ddp::shm {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };
enum class Op { kSum, kMin, kMax, kProduct };

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i] for i < count.
// dst may be one of the srcs (it is written only after a block is read).
// n >= 1. Thread-safe (no state).
void reduce(DType dtype, Op op, void* dst, const void* const* srcs, int n, size_t count);

size_t element_size(DType dtype);

}  // namespace ddp::shm
