// Collectives on a process group: all_reduce, broadcast, all_gather, gather,
// scatter, reduce, barrier, and helpers that move strings and small values.
//
// Semantics follow torch.distributed. Every rank of the group must call the
// same collectives in the same order with tensors of the same shape and
// dtype (all_gather/gather/scatter: every rank's tensor has the same shape).
// Tensors are reduced in place. Gloo takes CPU tensors (and CUDA tensors
// where libtorch has CUDA); NCCL takes CUDA tensors on the rank's device.
// Tensors must be contiguous or they are rejected with InvalidArgument.
// Zero-element tensors are allowed; all_gather, gather and scatter of them
// complete without communication (Gloo cannot exchange them).
//
// Errors: InvalidArgument for bad arguments (before anything is sent);
// TimeoutError when the operation does not complete within its timeout;
// CommError when a peer fails or the transport breaks. Each message names
// the collective, its sequence number in the group, this rank and the size.
//
// Thread safety: see process_group.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

// Reduction operators, as torch.distributed.ReduceOp. AVG is SUM followed by
// a division by the group size (Gloo has no AVG); it needs a floating-point
// tensor.
enum class ReduceOp { SUM, AVG, MIN, MAX, PRODUCT };

const char* to_string(ReduceOp op);

struct CollectiveOptions {
  // The group to run on; null: default_group().
  ProcessGroupPtr group;
  // Bound on this operation; unset: the group's timeout. A collective that
  // times out leaves the group unusable, as in PyTorch.
  std::optional<std::chrono::milliseconds> timeout;
};

namespace detail {
struct WorkImpl;
}

// Handle on an asynchronous collective. Copyable (copies share the
// operation). The tensors passed in must stay alive and untouched until
// wait() returns.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkImpl> impl);

  // Blocks until the operation has completed and its result is in the
  // tensors; rethrows its error (TimeoutError, CommError). Calling wait()
  // again returns at once (or rethrows the same error).
  void wait();
  // True once the operation has finished, successfully or not. Never blocks.
  bool is_completed() const;
  // Whether this handle refers to an operation.
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<detail::WorkImpl> impl_;
};

// Reduces `tensor` across ranks in place; every rank gets the result.
// bfloat16 works on every backend here: where Gloo lacks it (PyTorch
// 1.13) it travels as float32 and the sum is rounded back once.
// Dense CPU tensors of float32/64, float16, bfloat16, int32 or int64 go
// through shared memory between the ranks of one host (docs/shared_memory.md:
// sums in rank order, bitwise identical on every rank), everything else
// through the group's backend.
void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                const CollectiveOptions& options = {});
Work all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                      const CollectiveOptions& options = {});

// Copies rank `src`'s `tensor` into `tensor` on every other rank. When every
// rank is on one host, through shared memory (the same tensors as
// all_reduce); else through the backend.
void broadcast(at::Tensor& tensor, int src,
               const CollectiveOptions& options = {});
Work broadcast_async(at::Tensor& tensor, int src,
                     const CollectiveOptions& options = {});

// Returns every rank's `tensor`, indexed by rank (size() tensors, each of
// `tensor`'s shape and dtype, freshly allocated).
std::vector<at::Tensor> all_gather(const at::Tensor& tensor,
                                   const CollectiveOptions& options = {});

// Rank `dst` receives every rank's `tensor` indexed by rank; the other ranks
// receive an empty vector.
std::vector<at::Tensor> gather(const at::Tensor& tensor, int dst,
                               const CollectiveOptions& options = {});

// Rank `src` passes size() tensors (ignored elsewhere); every rank's `output`
// receives the one at its rank. `output` must have their shape and dtype.
void scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
             int src, const CollectiveOptions& options = {});

// Reduces `tensor` into rank `dst`'s `tensor`; other ranks' tensors are left
// in an unspecified state (as in PyTorch).
void reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM,
            const CollectiveOptions& options = {});

// Returns once every rank of the group has called barrier().
void barrier(const CollectiveOptions& options = {});

// Object helpers (torch.distributed.all_gather_object / broadcast_object_list
// for bytes): strings may differ in length across ranks.
std::vector<std::string> all_gather_string(const std::string& value,
                                           const CollectiveOptions& options = {});
// Rank `src`'s `value` on every rank (other ranks' `value` is ignored).
std::string broadcast_string(const std::string& value, int src,
                             const CollectiveOptions& options = {});

// Trivially copyable values (an int, a struct of counters): every rank's
// value indexed by rank, and rank src's value everywhere.
template <typename T>
std::vector<T> all_gather_value(const T& value,
                                const CollectiveOptions& options = {}) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::string bytes(reinterpret_cast<const char*>(&value), sizeof(T));
  std::vector<T> out;
  for (const std::string& b : all_gather_string(bytes, options)) {
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    out.push_back(v);
  }
  return out;
}
template <typename T>
T broadcast_value(const T& value, int src,
                  const CollectiveOptions& options = {}) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::string b = broadcast_string(
      std::string(reinterpret_cast<const char*>(&value), sizeof(T)), src,
      options);
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

}  // namespace ddp
