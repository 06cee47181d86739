// reduce_scatter_tensor, reduce_scatter, all_gather_into_tensor,
// all_to_all_single, all_to_all (collectives_sharding.h; Note [Sharding on
// Gloo] there).
#include "ddp/collectives_sharding.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <numeric>

#include "collective_args.h"
#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp {
namespace {

using detail::check_avg;
using detail::check_same_dtype;
using detail::check_tensor;
using detail::on_group_device;
using detail::staged;
using detail::start_work;
using std::chrono::milliseconds;

// A call that moves nothing (zero elements on every rank): numbered and
// recorded like any other, complete at once.
Work nothing_to_move(const CollectiveOptions& options, const char* op) {
  return Work(start_work(options, op, [](compat::Backend&, milliseconds) {
    return c10::intrusive_ptr<c10d::Work>();
  }));
}

void check_chunks(const at::Tensor& whole, const at::Tensor& chunk, int world, const char* op,
                  const char* whole_name, const char* chunk_name) {
  if (whole.numel() != world * chunk.numel()) {
    throw InvalidArgument(fmt::format(
        "{}: {} is {} ({} elements), but {} is {}: {} must hold world_size ({}) times {}'s {} "
        "elements ({})",
        op, whole_name, detail::describe_tensor(whole), whole.numel(), chunk_name,
        detail::describe_tensor(chunk), whole_name, world, chunk_name, chunk.numel(),
        world * chunk.numel()));
  }
}

}  // namespace

Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                 const CollectiveOptions& options) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  check_tensor(output, kOp, "output", options);
  check_tensor(input, kOp, "input", options);
  check_same_dtype(output, input, kOp, "output", "input");
  check_avg(input, op, kOp);
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  const int world = group.size;
  check_chunks(input, output, world, kOp, "input", "output");
  const int64_t m = output.numel();
  if (m == 0) return nothing_to_move(options, kOp);
  const int divisor = op == ReduceOp::AVG ? world : 1;
  auto fingerprint = [&] {
    return fmt::format("{} {} input {}", kOp, to_string(op), detail::describe_tensor(input));
  };
  at::Tensor out = output;
  if (group.backend_name != "nccl") {  // Note [Sharding on Gloo]
    const bool widen = detail::widen_bfloat16(group, input, op);
    std::vector<at::Tensor> tensors{widen ? input.to(at::kFloat) : input.clone()};
    auto w = start_work(options, kOp, [&](compat::Backend& b, milliseconds t) {
      c10d::AllreduceOptions o;
      o.reduceOp = detail::to_c10d(op);
      o.timeout = t;
      return detail::backend_all_reduce(group, b, tensors, o);
    }, fingerprint);
    at::Tensor whole = tensors[0];
    const int rank = group.rank;
    w->then = [out, whole, rank, m, divisor]() mutable {
      at::Tensor mine = whole.reshape({-1}).narrow(0, rank * m, m);
      if (divisor != 1) mine.div_(divisor);
      out.copy_(mine.view(out.sizes()));
    };
    return Work(std::move(w));
  }
  std::vector<at::Tensor> io{on_group_device(group, output), on_group_device(group, input)};
  auto w = start_work(options, kOp, [&](compat::Backend& b, milliseconds t) {
    c10d::ReduceScatterOptions o;
    o.reduceOp = detail::to_c10d(op);
    o.timeout = t;
    return b._reduce_scatter_base(io[0], io[1], o);
  }, fingerprint);
  if (divisor != 1 || staged(group, output)) {
    at::Tensor result = io[0];
    w->then = [out, result, divisor]() mutable {
      if (divisor != 1) result.div_(divisor);
      if (!result.is_same(out)) out.copy_(result);
    };
    w->then_on_host = staged(group, output);
  }
  return Work(std::move(w));
}

void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const CollectiveOptions& options) {
  reduce_scatter_tensor_async(output, input, op, options).wait();
}

void reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                    const CollectiveOptions& options) {
  constexpr const char* kOp = "reduce_scatter";
  check_tensor(output, kOp, "output", options);
  const int world = detail::resolve_group(options).size();
  if (static_cast<int>(inputs.size()) != world) {
    throw InvalidArgument(fmt::format("{}: inputs has {} tensors; pass world_size ({}), one per "
                                      "rank", kOp, inputs.size(), world));
  }
  std::vector<at::Tensor> flat;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], kOp, "inputs[i]", options);
    if (inputs[i].sizes() != output.sizes() || inputs[i].scalar_type() != output.scalar_type()) {
      throw InvalidArgument(fmt::format("{}: inputs[{}] is {} but output is {}: every input "
                                        "must have output's shape and dtype", kOp, i,
                                        detail::describe_tensor(inputs[i]),
                                        detail::describe_tensor(output)));
    }
    flat.push_back(inputs[i].reshape({-1}));
  }
  reduce_scatter_tensor(output, at::cat(flat), op, options);
}

Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const CollectiveOptions& options) {
  constexpr const char* kOp = "all_gather_into_tensor";
  check_tensor(output, kOp, "output", options);
  check_tensor(input, kOp, "input", options);
  check_same_dtype(output, input, kOp, "output", "input");
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  const int world = group.size;
  check_chunks(output, input, world, kOp, "output", "input");
  const int64_t n = input.numel();
  if (n == 0) return nothing_to_move(options, kOp);  // Note [Empty tensors]
  auto fingerprint = [&] { return fmt::format("{} {}", kOp, detail::describe_tensor(input)); };
  if (group.backend_name != "nccl") {  // Note [Sharding on Gloo]: into the output's chunks
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs(1);
    at::Tensor flat = output.view({-1});
    for (int i = 0; i < world; ++i) outputs[0].push_back(flat.narrow(0, i * n, n).view(input.sizes()));
    return Work(start_work(options, kOp, [&](compat::Backend& b, milliseconds t) {
      c10d::AllgatherOptions o;
      o.timeout = t;
      return b.allgather(outputs, inputs, o);
    }, fingerprint));
  }
  std::vector<at::Tensor> io{on_group_device(group, output), on_group_device(group, input)};
  auto w = start_work(options, kOp, [&](compat::Backend& b, milliseconds t) {
    c10d::AllgatherOptions o;
    o.timeout = t;
    return b._allgather_base(io[0], io[1], o);
  }, fingerprint);
  if (staged(group, output)) {
    at::Tensor out = output, result = io[0];
    w->then = [out, result]() mutable { out.copy_(result); };
    w->then_on_host = true;
  }
  return Work(std::move(w));
}

void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const CollectiveOptions& options) {
  all_gather_into_tensor_async(output, input, options).wait();
}

}  // namespace ddp
