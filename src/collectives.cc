#include "ddp/collectives.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "collective_args.h"
#include "compat/torch_compat.h"
#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp {
namespace {

// Note [Empty tensors]: Gloo's allgather divides by the element count and
// dies with SIGFPE on zero-element tensors. Every rank passes the same shape
// (a documented precondition), so all ranks skip the exchange together:
// all_gather, gather and scatter of empty tensors complete locally.

using detail::check_avg;
using detail::check_root;
using detail::check_tensor;
using detail::empty_likes;
using detail::on_group_device;
using detail::staged;
using detail::start_work;
using detail::to_c10d;
using detail::widen_bfloat16;
using std::chrono::milliseconds;

Work wrap(std::shared_ptr<detail::WorkImpl> w) { return Work(std::move(w)); }

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::PRODUCT: return "PRODUCT";
  }
  return "?";
}

// Note [bfloat16 over old Gloo]
// Gloo before PyTorch 2.0 cannot reduce bfloat16 ("Invalid scalar type").
// Such an all_reduce that shared memory does not take is widened: the
// tensor travels as float32 and the result is rounded back into it when the
// operation completes. Every bfloat16 value is exact in float32, so the
// result is the sum rounded once (at least as accurate as a bfloat16 sum);
// the bytes on the wire are float32's.

Work all_reduce_async(at::Tensor& tensor, ReduceOp op,
                      const CollectiveOptions& options) {
  check_tensor(tensor, "all_reduce", "tensor", options);
  check_avg(tensor, op, "all_reduce");
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  const bool widen = widen_bfloat16(group, tensor, op);
  const bool stage = staged(group, tensor);
  std::vector<at::Tensor> tensors{widen ? tensor.to(at::kFloat) : on_group_device(group, tensor)};
  auto w = start_work(options, "all_reduce", [&](compat::Backend& b, milliseconds t) {
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = t;
    return detail::backend_all_reduce(group, b, tensors, o);
  }, [&] { return fmt::format("all_reduce {} {}", to_string(op), detail::describe_tensors(tensors)); });
  if (op == ReduceOp::AVG || widen || stage) {
    int size = op == ReduceOp::AVG ? w->group->size() : 1;
    at::Tensor out = tensor, result = tensors[0];
    w->then = [out, result, size]() mutable {
      if (size != 1) result.div_(size);
      if (!result.is_same(out)) out.copy_(result);
    };
    w->then_on_host = stage;
  }
  return wrap(std::move(w));
}

void all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveOptions& options) {
  all_reduce_async(tensor, op, options).wait();
}

Work broadcast_async(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  check_tensor(tensor, "broadcast", "tensor", options);
  check_root(src, "broadcast", "src", options);
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  std::vector<at::Tensor> tensors{on_group_device(group, tensor)};
  auto w = start_work(options, "broadcast", [&](compat::Backend& b, milliseconds t) {
    c10d::BroadcastOptions o;
    o.rootRank = src;
    o.timeout = t;
    return detail::backend_broadcast(group, b, tensors, o);
  }, [&] { return fmt::format("broadcast src={} {}", src, detail::describe_tensors(tensors)); });
  if (staged(group, tensor)) {
    at::Tensor out = tensor, result = tensors[0];
    w->then = [out, result]() mutable { out.copy_(result); };
    w->then_on_host = true;
  }
  return wrap(std::move(w));
}

void broadcast(at::Tensor& tensor, int src, const CollectiveOptions& options) {
  broadcast_async(tensor, src, options).wait();
}

std::vector<at::Tensor> all_gather(const at::Tensor& tensor,
                                   const CollectiveOptions& options) {
  check_tensor(tensor, "all_gather", "tensor", options);
  const detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  if (tensor.numel() == 0) return empty_likes(tensor, group.size);  // Note [Empty tensors]
  std::vector<at::Tensor> inputs{on_group_device(group, tensor)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < group.size; ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  wrap(start_work(options, "all_gather", [&](compat::Backend& b, milliseconds t) {
    c10d::AllgatherOptions o;
    o.timeout = t;
    return b.allgather(outputs, inputs, o);
  }, [&] { return "all_gather " + detail::describe_tensors(inputs); })).wait();
  if (staged(group, tensor)) {
    for (at::Tensor& out : outputs[0]) out = out.to(tensor.device());
  }
  return outputs[0];
}

std::vector<at::Tensor> gather(const at::Tensor& tensor, int dst,
                               const CollectiveOptions& options) {
  check_tensor(tensor, "gather", "tensor", options);
  check_root(dst, "gather", "dst", options);
  const ProcessGroup& g = detail::resolve_group(options);
  if (tensor.numel() == 0) {  // Note [Empty tensors]
    return g.rank() == dst ? empty_likes(tensor, g.size()) : std::vector<at::Tensor>{};
  }
  std::vector<at::Tensor> inputs{on_group_device(g.impl(), tensor)};
  std::vector<std::vector<at::Tensor>> outputs;
  if (g.rank() == dst) {
    outputs.emplace_back();
    for (int i = 0; i < g.size(); ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  }
  wrap(start_work(options, "gather", [&](compat::Backend& b, milliseconds t) {
    c10d::GatherOptions o;
    o.rootRank = dst;
    o.timeout = t;
    return b.gather(outputs, inputs, o);
  }, [&] { return fmt::format("gather dst={} {}", dst, detail::describe_tensors(inputs)); })).wait();
  if (outputs.empty()) return {};
  if (staged(g.impl(), tensor)) {
    for (at::Tensor& out : outputs[0]) out = out.to(tensor.device());
  }
  return outputs[0];
}

void scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src,
             const CollectiveOptions& options) {
  check_tensor(output, "scatter", "output", options);
  check_root(src, "scatter", "src", options);
  const ProcessGroup& g = detail::resolve_group(options);
  std::vector<std::vector<at::Tensor>> in;
  if (g.rank() == src) {
    if (static_cast<int>(inputs.size()) != g.size()) {
      throw InvalidArgument(fmt::format(
          "scatter: rank {} (src) must pass {} inputs, one per rank; got {}",
          src, g.size(), inputs.size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(inputs[i], "scatter", "inputs[i]", options);
      if (inputs[i].sizes() != output.sizes() ||
          inputs[i].scalar_type() != output.scalar_type()) {
        throw InvalidArgument(fmt::format(
            "scatter: inputs[{}] is {} but output is {}", i,
            detail::describe_tensor(inputs[i]), detail::describe_tensor(output)));
      }
    }
    in.emplace_back();
    for (const at::Tensor& t : inputs) in[0].push_back(on_group_device(g.impl(), t));
  }
  if (output.numel() == 0) return;  // Note [Empty tensors]
  std::vector<at::Tensor> outputs{on_group_device(g.impl(), output)};
  wrap(start_work(options, "scatter", [&](compat::Backend& b, milliseconds t) {
    c10d::ScatterOptions o;
    o.rootRank = src;
    o.timeout = t;
    return b.scatter(outputs, in, o);
  }, [&] { return fmt::format("scatter src={} {}", src, detail::describe_tensors(outputs)); })).wait();
  if (!outputs[0].is_same(output)) output.copy_(outputs[0]);
}

void reduce(at::Tensor& tensor, int dst, ReduceOp op,
            const CollectiveOptions& options) {
  check_tensor(tensor, "reduce", "tensor", options);
  check_root(dst, "reduce", "dst", options);
  check_avg(tensor, op, "reduce");
  const detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  std::vector<at::Tensor> tensors{on_group_device(group, tensor)};
  auto w = start_work(options, "reduce", [&](compat::Backend& b, milliseconds t) {
    c10d::ReduceOptions o;
    o.reduceOp = to_c10d(op);
    o.rootRank = dst;
    o.timeout = t;
    return b.reduce(tensors, o);
  }, [&] { return fmt::format("reduce {} dst={} {}", to_string(op), dst, detail::describe_tensors(tensors)); });
  const bool average = op == ReduceOp::AVG && w->group->rank() == dst;
  if (average || staged(group, tensor)) {
    int size = average ? w->group->size() : 1;
    at::Tensor out = tensor, result = tensors[0];
    w->then = [out, result, size]() mutable {
      if (size != 1) result.div_(size);
      if (!result.is_same(out)) out.copy_(result);
    };
    w->then_on_host = staged(group, tensor);
  }
  wrap(std::move(w)).wait();
}

void barrier(const CollectiveOptions& options) {
  wrap(start_work(options, "barrier", [&](compat::Backend& b, milliseconds t) {
    c10d::BarrierOptions o;
    o.timeout = t;
    return b.barrier(o);
  })).wait();
}

std::vector<std::string> all_gather_string(const std::string& value,
                                           const CollectiveOptions& options) {
  at::Tensor len = at::zeros({1}, at::kLong);
  len.data_ptr<int64_t>()[0] = static_cast<int64_t>(value.size());
  std::vector<at::Tensor> lens = all_gather(len, options);
  int64_t max_len = 1;
  for (const auto& l : lens) max_len = std::max(max_len, l.data_ptr<int64_t>()[0]);
  at::Tensor bytes = at::zeros({max_len}, at::kByte);
  std::copy(value.begin(), value.end(), bytes.data_ptr<uint8_t>());
  std::vector<at::Tensor> all = all_gather(bytes, options);
  std::vector<std::string> out;
  for (size_t i = 0; i < all.size(); ++i) {
    const char* p = reinterpret_cast<const char*>(all[i].data_ptr<uint8_t>());
    out.emplace_back(p, static_cast<size_t>(lens[i].data_ptr<int64_t>()[0]));
  }
  return out;
}

std::string broadcast_string(const std::string& value, int src,
                             const CollectiveOptions& options) {
  at::Tensor len = at::zeros({1}, at::kLong);
  len.data_ptr<int64_t>()[0] = static_cast<int64_t>(value.size());
  broadcast(len, src, options);
  int64_t n = len.data_ptr<int64_t>()[0];
  at::Tensor bytes = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (detail::resolve_group(options).rank() == src) {
    std::copy(value.begin(), value.end(), bytes.data_ptr<uint8_t>());
  }
  broadcast(bytes, src, options);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

}  // namespace ddp
