// The argument checks and tensor placement every collective shares
// (collective_args.h).
#include "collective_args.h"

#include <ATen/ops/empty_like.h>
#include <fmt/format.h>

#include "compat/torch_compat.h"
#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp::detail {

// Note [Staging on NCCL]
// NCCL moves CUDA tensors only, and PyTorch refuses anything else on a NCCL
// group. ddp's collectives take CPU tensors there too: such a tensor is
// copied to the group's device (ProcessGroup::device()), the collective runs
// there, and the result is copied back once the collective has completed
// on the host's watch (WorkImpl::then_on_host), so the wait stays bounded
// by the timeout. ddp's own small collectives (metrics, join's count, the
// string helpers, checkpoint outcomes, the bucket rebuild) rely on it. It
// costs a copy each way: give large tensors on the device. A CUDA tensor on
// another GPU than the group's is refused.
bool staged(const ProcessGroupImpl& g, const at::Tensor& t) {
  return g.backend_name == "nccl" && !t.is_cuda();
}

at::Tensor on_group_device(const ProcessGroupImpl& g, const at::Tensor& t) {
  return staged(g, t) ? t.to(g.device) : t;
}

void check_tensor(const at::Tensor& t, const char* op, const char* what,
                  const CollectiveOptions& options) {
  if (!t.defined()) {
    throw InvalidArgument(fmt::format("{}: {} is an undefined tensor", op, what));
  }
  if (!t.is_contiguous()) {
    throw InvalidArgument(fmt::format(
        "{}: {} must be contiguous (call .contiguous() first)", op, what));
  }
  const ProcessGroupImpl& g = resolve_group(options).impl();
  if (g.backend_name == "nccl" && t.is_cuda() && t.device() != g.device) {
    throw InvalidArgument(fmt::format(
        "{}: {} is on {}, but this rank's NCCL group uses {} (InitOptions::device_id, "
        "cuda:LOCAL_RANK by default); move it there with .to({})",
        op, what, t.device().str(), g.device.str(), g.device.str()));
  }
}

void check_root(int root, const char* op, const char* name,
                const CollectiveOptions& options) {
  int size = resolve_group(options).size();
  if (root < 0 || root >= size) {
    throw InvalidArgument(fmt::format("{}: {}={} is not a rank of the group (size {})",
                                      op, name, root, size));
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return c10d::ReduceOp::SUM;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::PRODUCT: return c10d::ReduceOp::PRODUCT;
  }
  throw InvalidArgument("unknown ReduceOp");
}

void check_avg(const at::Tensor& t, ReduceOp op, const char* name) {
  if (op == ReduceOp::AVG && !at::isFloatingType(t.scalar_type()) &&
      !at::isComplexType(t.scalar_type())) {
    throw InvalidArgument(fmt::format(
        "{}: ReduceOp::AVG needs a floating-point tensor, got {}; use SUM "
        "and divide, or convert first",
        name, dtype_name(t.scalar_type())));
  }
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op,
                      const char* a_name, const char* b_name) {
  if (a.scalar_type() != b.scalar_type()) {
    throw InvalidArgument(fmt::format("{}: {} is {} but {} is {}: they must have one dtype", op,
                                      a_name, dtype_name(a.scalar_type()), b_name,
                                      dtype_name(b.scalar_type())));
  }
}

bool widen_bfloat16(ProcessGroupImpl& group, const at::Tensor& t, ReduceOp op) {
  return t.scalar_type() == at::kBFloat16 && group.backend_name == "gloo" &&
         !compat::gloo_reduces_bfloat16() &&
         !(group.shm && shm::ShmGroup::supports(t, to_c10d(op)));
}

std::vector<at::Tensor> empty_likes(const at::Tensor& t, int n) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(at::empty_like(t));
  return out;
}

}  // namespace ddp::detail
