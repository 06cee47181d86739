// all_to_all_single and all_to_all (collectives_sharding.h).
//
// Note [All-to-all sizes]: Gloo's and NCCL's all-to-all trust every rank's
// split sizes; a rank that sends a piece of another size than its receiver
// expects crashes the receiver (Gloo) or corrupts memory. So the ranks first
// all_gather their split sizes and row sizes (2 * world_size + 1 integers),
// and every rank checks every pair (i, j): the same error, naming both
// ranks and both sizes, is raised on every rank before any data moves.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <numeric>

#include "collective_args.h"
#include "ddp/collectives_sharding.h"
#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;

int64_t rows_of(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }

int64_t row_numel(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// The split sizes a call means: `given`, or equal pieces of `t`'s rows.
std::vector<int64_t> resolve_splits(const std::vector<int64_t>& given, const at::Tensor& t,
                                    int world, const char* name) {
  const int64_t rows = rows_of(t);
  if (given.empty()) {
    if (rows % world != 0) {
      throw InvalidArgument(fmt::format(
          "all_to_all_single: {} is empty (equal pieces), but {} rows do not divide among "
          "world_size {} ranks; pass {} explicitly", name, rows, world, name));
    }
    return std::vector<int64_t>(world, rows / world);
  }
  if (static_cast<int>(given.size()) != world) {
    throw InvalidArgument(fmt::format("all_to_all_single: {} has {} entries; pass world_size ({})",
                                      name, given.size(), world));
  }
  for (int j = 0; j < world; ++j) {
    if (given[j] < 0) {
      throw InvalidArgument(fmt::format("all_to_all_single: {}[{}] is {}: sizes are >= 0", name,
                                        j, given[j]));
    }
  }
  const int64_t sum = std::accumulate(given.begin(), given.end(), int64_t{0});
  if (sum != rows) {
    throw InvalidArgument(fmt::format("all_to_all_single: {} adds up to {} rows, but the tensor "
                                      "has {} (dim 0)", name, sum, rows));
  }
  return given;
}

// Note [All-to-all sizes]. `list_form`: the message speaks of all_to_all's
// inputs[j] and outputs[i] (element counts) instead of rows. Returns the
// elements all ranks send together: with none, no rank calls the backend.
int64_t check_sizes_agree(const std::vector<int64_t>& in_splits,
                       const std::vector<int64_t>& out_splits, int64_t row,
                       const CollectiveOptions& options, bool list_form) {
  const int world = static_cast<int>(in_splits.size());
  at::Tensor mine = at::empty({2 * world + 1}, at::kLong);
  int64_t* p = mine.data_ptr<int64_t>();
  std::copy(in_splits.begin(), in_splits.end(), p);
  std::copy(out_splits.begin(), out_splits.end(), p + world);
  p[2 * world] = row;
  std::vector<at::Tensor> all = all_gather(mine, options);
  auto at_rank = [&](int r, int k) { return all[r].data_ptr<int64_t>()[k]; };
  int64_t total = 0;
  for (int i = 0; i < world; ++i) {
    for (int j = 0; j < world; ++j) {
      const int64_t sent = at_rank(i, j) * at_rank(i, 2 * world);
      total += sent;
      const int64_t expected = at_rank(j, world + i) * at_rank(j, 2 * world);
      if (sent == expected) continue;
      if (list_form) {
        throw InvalidArgument(fmt::format(
            "all_to_all: rank {}'s inputs[{}] has {} elements, but rank {}'s outputs[{}] has {}: "
            "they must match", i, j, at_rank(i, j), j, i, at_rank(j, world + i)));
      }
      throw InvalidArgument(fmt::format(
          "all_to_all_single: rank {} sends {} rows of {} elements to rank {} "
          "(input_split_sizes[{}]), but rank {} expects {} rows of {} (output_split_sizes[{}]); "
          "rank i's input_split_sizes[j] must equal rank j's output_split_sizes[i]",
          i, at_rank(i, j), at_rank(i, 2 * world), j, j, j, at_rank(j, world + i),
          at_rank(j, 2 * world), i));
    }
  }
  return total;
}

void exchange(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> out_splits,
              std::vector<int64_t> in_splits, const CollectiveOptions& options, const char* op) {
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  std::vector<at::Tensor> io{detail::on_group_device(group, output),
                             detail::on_group_device(group, input)};
  auto w = detail::start_work(options, op, [&](compat::Backend& b, milliseconds t) {
    c10d::AllToAllOptions o;
    o.timeout = t;
    return b.alltoall_base(io[0], io[1], out_splits, in_splits, o);
  }, [&] { return fmt::format("{} {} rows of {}", op, detail::dtype_name(input.scalar_type()),
                              row_numel(input)); });
  if (detail::staged(group, output)) {
    at::Tensor out = output, result = io[0];
    w->then = [out, result]() mutable { out.copy_(result); };
    w->then_on_host = true;
  }
  Work(std::move(w)).wait();
}

}  // namespace

void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes,
                       const CollectiveOptions& options) {
  constexpr const char* kOp = "all_to_all_single";
  detail::check_tensor(output, kOp, "output", options);
  detail::check_tensor(input, kOp, "input", options);
  detail::check_same_dtype(output, input, kOp, "output", "input");
  if (input.dim() == 0 || output.dim() == 0) {
    throw InvalidArgument("all_to_all_single: input and output need a dimension 0 (rows)");
  }
  if (row_numel(input) != row_numel(output)) {
    throw InvalidArgument(fmt::format("all_to_all_single: input's rows ({}) and output's ({}) "
                                      "differ in size", detail::describe_tensor(input),
                                      detail::describe_tensor(output)));
  }
  const int world = detail::resolve_group(options).size();
  auto in_splits = resolve_splits(input_split_sizes, input, world, "input_split_sizes");
  auto out_splits = resolve_splits(output_split_sizes, output, world, "output_split_sizes");
  if (check_sizes_agree(in_splits, out_splits, row_numel(input), options, false) == 0) return;
  exchange(output, input, out_splits, in_splits, options, kOp);
}

void all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                const CollectiveOptions& options) {
  constexpr const char* kOp = "all_to_all";
  const int world = detail::resolve_group(options).size();
  if (static_cast<int>(inputs.size()) != world || static_cast<int>(outputs.size()) != world) {
    throw InvalidArgument(fmt::format("{}: inputs has {} tensors and outputs {}; pass world_size "
                                      "({}) each, one per rank", kOp, inputs.size(),
                                      outputs.size(), world));
  }
  std::vector<at::Tensor> flat;
  std::vector<int64_t> in_splits, out_splits;
  for (int j = 0; j < world; ++j) {
    detail::check_tensor(inputs[j], kOp, "inputs[j]", options);
    detail::check_tensor(outputs[j], kOp, "outputs[j]", options);
    detail::check_same_dtype(inputs[j], inputs[0], kOp, "inputs[j]", "inputs[0]");
    detail::check_same_dtype(outputs[j], inputs[0], kOp, "outputs[j]", "inputs[0]");
    flat.push_back(inputs[j].reshape({-1}));
    in_splits.push_back(inputs[j].numel());
    out_splits.push_back(outputs[j].numel());
  }
  if (check_sizes_agree(in_splits, out_splits, 1, options, true) == 0) return;
  const int64_t total = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  at::Tensor out = at::empty({total}, outputs[0].options());
  exchange(out, at::cat(flat), out_splits, in_splits, options, kOp);
  int64_t offset = 0;
  for (int j = 0; j < world; ++j) {
    outputs[j].view({-1}).copy_(out.narrow(0, offset, out_splits[j]));
    offset += out_splits[j];
  }
}

}  // namespace ddp
