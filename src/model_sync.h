// Internal: making the replicas identical at construction and before each
// forward (verification across ranks, coalesced broadcasts).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/collectives.h"

namespace ddp::detail {

struct NamedTensor {
  std::string kind;  // "parameter" or "buffer"
  std::string name;
  at::Tensor tensor;
};

// Checks that every rank has the same tensors: first the count, then each
// one's kind, name, shape, dtype and requires_grad, in order. Rank 0's list
// is broadcast, every rank compares, and the first difference found by any
// rank is thrown as MismatchError on every rank (two collectives).
void verify_same_model(const std::vector<NamedTensor>& tensors,
                       const CollectiveOptions& options);

// Broadcasts `tensors` from `src` in place, coalesced: one flat buffer per
// (dtype, device) and at most `chunk_bytes` per broadcast (PyTorch:
// 250 MiB). Tensors must not be autograd-tracked while this runs (it uses
// NoGradGuard).
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int src,
                         const CollectiveOptions& options,
                         int64_t chunk_bytes = int64_t{250} << 20);

}  // namespace ddp::detail
