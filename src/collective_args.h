// Internal: the argument checks and tensor placement every collective shares
// (collectives.cc, collectives_sharding.cc): contiguity and device checks,
// ReduceOp's translation, Note [Staging on NCCL] and Note [bfloat16 over old
// Gloo]. Errors are InvalidArgument naming the operation and the argument.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/collectives.h"
#include "process_group_impl.h"

namespace ddp::detail {

// Note [Staging on NCCL] (collective_args.cc): a CPU tensor on a NCCL group is
// copied to the group's device for the operation.
bool staged(const ProcessGroupImpl& g, const at::Tensor& t);
// `t` itself, or its copy on the group's device when staged.
at::Tensor on_group_device(const ProcessGroupImpl& g, const at::Tensor& t);

// Defined, contiguous, and on the group's device when it is a CUDA tensor
// of a NCCL group; else InvalidArgument naming `op` and `what`.
void check_tensor(const at::Tensor& t, const char* op, const char* what,
                  const CollectiveOptions& options);
// `root` is a rank of the group; else InvalidArgument naming `name`.
void check_root(int root, const char* op, const char* name, const CollectiveOptions& options);
// AVG needs a floating-point (or complex) tensor.
void check_avg(const at::Tensor& t, ReduceOp op, const char* name);
// Same dtype for `a` and `b`, named `a_name` and `b_name` in the error.
void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op,
                      const char* a_name, const char* b_name);

// SUM for AVG (the division follows the sum).
c10d::ReduceOp to_c10d(ReduceOp op);

// Note [bfloat16 over old Gloo] (collectives.cc): whether an all_reduce of
// `t` must travel as float32.
bool widen_bfloat16(ProcessGroupImpl& group, const at::Tensor& t, ReduceOp op);

// `n` fresh tensors like `t`.
std::vector<at::Tensor> empty_likes(const at::Tensor& t, int n);

}  // namespace ddp::detail
