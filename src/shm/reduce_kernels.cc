#include "shm/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ddp::shm {
namespace {

// Elements per block: the accumulator stays in L1, dst may alias a source.
constexpr size_t kBlock = 512;

template <typename Acc>
struct SumOp { static Acc apply(Acc a, Acc b) { return a + b; } };
template <typename Acc>
struct ProdOp { static Acc apply(Acc a, Acc b) { return a * b; } };
template <typename Acc>
struct MinOp { static Acc apply(Acc a, Acc b) { return b < a ? b : a; } };
template <typename Acc>
struct MaxOp { static Acc apply(Acc a, Acc b) { return a < b ? b : a; } };

// One block: acc = srcs[0]; acc = acc op srcs[k] for k = 1..n-1; dst = acc.
// The inner loops are plain and contiguous: the compiler vectorises them.
// always_inline: the loops must be compiled inside the target_clones
// functions below, for their instruction sets (a call would run the
// baseline code).
template <typename T, typename Acc, typename O>
__attribute__((always_inline)) inline void reduce_block(T* dst, const T* const* srcs, int n, size_t offset, size_t len) {
  Acc acc[kBlock];
  const T* s0 = srcs[0] + offset;
  for (size_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(s0[i]);
  for (int k = 1; k < n; ++k) {
    const T* s = srcs[k] + offset;
    for (size_t i = 0; i < len; ++i) acc[i] = O::apply(acc[i], static_cast<Acc>(s[i]));
  }
  T* d = dst + offset;
  for (size_t i = 0; i < len; ++i) d[i] = static_cast<T>(acc[i]);
}

template <typename T, typename Acc, typename O>
__attribute__((always_inline)) inline void reduce_all(void* dst, const void* const* srcs, int n, size_t count) {
  auto* d = static_cast<T*>(dst);
  std::vector<const T*> s(static_cast<size_t>(n));  // as many as ranks on the host
  for (int k = 0; k < n; ++k) s[k] = static_cast<const T*>(srcs[k]);
  for (size_t off = 0; off < count; off += kBlock) {
    reduce_block<T, Acc, O>(d, s.data(), n, off, std::min(kBlock, count - off));
  }
}

// One clone per instruction set, chosen when libddp is loaded (an IFUNC).
// Not under ThreadSanitizer: GCC instruments the resolver it generates, and
// the loader runs resolvers before TSan is set up, so every test binary
// crashed while libddp was being relocated.
#if defined(__SANITIZE_THREAD__)
#define DDP_PER_ISA_CLONES
#else
#define DDP_PER_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

// The float sum, the hot path of gradient averaging.
DDP_PER_ISA_CLONES
void sum_float32(void* dst, const void* const* srcs, int n, size_t count) {
  reduce_all<float, float, SumOp<float>>(dst, srcs, n, count);
}

DDP_PER_ISA_CLONES
void sum_float64(void* dst, const void* const* srcs, int n, size_t count) {
  reduce_all<double, double, SumOp<double>>(dst, srcs, n, count);
}

template <typename T, typename Acc>
void reduce_typed(Op op, void* dst, const void* const* srcs, int n, size_t count) {
  switch (op) {
    case Op::kSum: return reduce_all<T, Acc, SumOp<Acc>>(dst, srcs, n, count);
    case Op::kProduct: return reduce_all<T, Acc, ProdOp<Acc>>(dst, srcs, n, count);
    case Op::kMin: return reduce_all<T, Acc, MinOp<Acc>>(dst, srcs, n, count);
    case Op::kMax: return reduce_all<T, Acc, MaxOp<Acc>>(dst, srcs, n, count);
  }
}

}  // namespace

void reduce(DType dtype, Op op, void* dst, const void* const* srcs, int n, size_t count) {
  switch (dtype) {
    case DType::kFloat32:
      if (op == Op::kSum) return sum_float32(dst, srcs, n, count);
      return reduce_typed<float, float>(op, dst, srcs, n, count);
    case DType::kFloat64:
      if (op == Op::kSum) return sum_float64(dst, srcs, n, count);
      return reduce_typed<double, double>(op, dst, srcs, n, count);
    case DType::kFloat16: return reduce_typed<c10::Half, float>(op, dst, srcs, n, count);
    case DType::kBFloat16: return reduce_typed<c10::BFloat16, float>(op, dst, srcs, n, count);
    // Integer sums and products wrap (two's complement), as Gloo's do: in
    // unsigned arithmetic, where wrapping is defined.
    case DType::kInt32:
      if (op == Op::kSum) return reduce_all<int32_t, uint32_t, SumOp<uint32_t>>(dst, srcs, n, count);
      if (op == Op::kProduct) return reduce_all<int32_t, uint32_t, ProdOp<uint32_t>>(dst, srcs, n, count);
      return reduce_typed<int32_t, int32_t>(op, dst, srcs, n, count);
    case DType::kInt64:
      if (op == Op::kSum) return reduce_all<int64_t, uint64_t, SumOp<uint64_t>>(dst, srcs, n, count);
      if (op == Op::kProduct) return reduce_all<int64_t, uint64_t, ProdOp<uint64_t>>(dst, srcs, n, count);
      return reduce_typed<int64_t, int64_t>(op, dst, srcs, n, count);
  }
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kFloat16: case DType::kBFloat16: return 2;
  }
  return 1;
}

}  // namespace ddp::shm
