// ZeroRedundancyOptimizer: partition, sharded step, and the full state
// gathered to one rank and split again (Note [ZeRO state]).
#include "ddp/zero_redundancy_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/serialize/archive.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "model_sync.h"
#include "tensor_text.h"

namespace ddp {
namespace {

namespace optim = torch::optim;

// Note [ZeRO state]
// The full state is an OptimizerState (ddp/optimizer_state.h) of the
// equivalent unsharded optimizer: per group its options and, per parameter
// in param_groups() order, its state. A rank's shard optimizer has the same
// groups holding only the parameters it owns, in the same relative order,
// so rank r's j-th parameter of group g is the j-th parameter of g whose
// owner is r. Consolidation sends each rank's shard snapshot (bytes, as in
// a checkpoint) to one rank, which places every state at its global index;
// loading keeps, per group, the states of the parameters this rank owns.
// Both directions use ddp's checkpoint codecs, which check every field.

// PyTorch's partition: per group, largest numel first (stable among equal
// sizes), each to the rank with the fewest elements so far (sizes carry
// over between groups; ties to the lowest rank).
std::vector<std::vector<int>> assign_owners(const std::vector<optim::OptimizerParamGroup>& groups,
                                        int world) {
  std::vector<int64_t> sizes(static_cast<size_t>(world), 0);
  std::vector<std::vector<int>> owner;
  for (const auto& g : groups) {
    const auto& params = g.params();
    std::vector<size_t> order(params.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return params[a].numel() > params[b].numel();
    });
    owner.emplace_back(params.size(), 0);
    for (size_t i : order) {
      const auto r = std::min_element(sizes.begin(), sizes.end()) - sizes.begin();
      owner.back()[i] = static_cast<int>(r);
      sizes[static_cast<size_t>(r)] += params[i].numel();
    }
  }
  return owner;
}

// One line per parameter, "group G parameter I: float32[16, 8] cpu": what
// every rank must agree on.
std::vector<std::string> describe_params(const std::vector<optim::OptimizerParamGroup>& groups) {
  std::vector<std::string> lines;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      lines.push_back(fmt::format("group {} parameter {}: {} {}", g, i,
                                  detail::describe_tensor(p), p.device().str()));
    }
  }
  return lines;
}

// "" when the parameters are usable, else what is wrong with them.
std::string param_problem(const std::vector<optim::OptimizerParamGroup>& groups) {
  std::unordered_set<const void*> seen;
  int64_t count = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      ++count;
      if (!seen.insert(groups[g].params()[i].unsafeGetTensorImpl()).second) {
        return fmt::format(
            "parameter {} of group {} is listed twice (a tied weight?): pass each tensor once, "
            "as model.parameters() of a DistributedDataParallel does",
            i, g);
      }
    }
  }
  return count == 0 ? "no parameters to optimize" : "";
}

CollectiveOptions on(const ProcessGroupPtr& group) { return {group, std::nullopt}; }

// The shard broadcasts flatten at most this much at once: the flat copy is
// memory ZeRO exists to save, so it is bounded like a DDP bucket (25 MiB)
// rather than PyTorch's 250 MiB coalescing chunk.
constexpr int64_t kBroadcastChunkBytes = int64_t{25} << 20;

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(
    std::vector<optim::OptimizerParamGroup> groups, std::unique_ptr<optim::OptimizerOptions> defaults,
    Factory factory, ZeroRedundancyOptimizerOptions options)
    : Optimizer(std::move(groups), std::move(defaults)),
      factory_(std::move(factory)),
      group_(options.process_group ? options.process_group
                                     : (is_initialized() ? default_group() : nullptr)) {
  const int world = group_ ? group_->size() : 1;
  check_params_on_every_rank();
  if (world > 1) check_same_params_on_every_rank();
  owner_ = assign_owners(param_groups(), world);
  shard_of_rank_.resize(static_cast<size_t>(world));
  const int rank = group_ ? group_->rank() : 0;
  std::vector<optim::OptimizerParamGroup> local;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    std::vector<at::Tensor> mine;
    const auto& params = param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      shard_of_rank_[static_cast<size_t>(owner_[g][i])].push_back(params[i]);
      if (owner_[g][i] == rank) mine.push_back(params[i]);
    }
    local.emplace_back(std::move(mine), param_groups()[g].options().clone());
  }
  local_ = factory_(std::move(local));
}

// Every rank learns every rank's problem before anyone throws: one rank's
// bad list must not leave the others waiting in the next collective.
void ZeroRedundancyOptimizer::check_params_on_every_rank() const {
  std::string problem = param_problem(param_groups());
  std::vector<std::string> all{problem};
  if (group_ && group_->size() > 1) all = all_gather_string(problem, on(group_));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const bool mine = group_ == nullptr || static_cast<int>(r) == group_->rank();
    throw InvalidArgument("ZeroRedundancyOptimizer: " +
                          (mine ? all[r] : fmt::format("on rank {}: {}", r, all[r])));
  }
}

// Every rank compares every rank's parameter list with its own (an
// all_gather of their descriptions) and names the first difference.
void ZeroRedundancyOptimizer::check_same_params_on_every_rank() const {
  const std::vector<std::string> mine = describe_params(param_groups());
  const auto all = all_gather_string(fmt::format("{}", fmt::join(mine, "\n")), on(group_));
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<std::string> theirs;
    for (size_t start = 0; start <= all[r].size();) {
      const size_t end = std::min(all[r].find('\n', start), all[r].size());
      theirs.push_back(all[r].substr(start, end - start));
      start = end + 1;
    }
    if (theirs == mine) continue;
    size_t k = 0;
    while (k < mine.size() && k < theirs.size() && mine[k] == theirs[k]) ++k;
    const std::string here = k < mine.size() ? mine[k] : "nothing more";
    const std::string there = k < theirs.size() ? theirs[k] : "nothing more";
    throw MismatchError(fmt::format(
        "ZeroRedundancyOptimizer: rank {} has {} parameter(s), rank {} has {}; first difference "
        "at position {}: rank {} has {}, rank {} has {}. Every rank must pass the same "
        "parameters in the same order (model.parameters() of identical models)",
        group_->rank(), mine.size(), r, theirs.size(), k, group_->rank(), here, r, there));
  }
}

// add_param_group() (not virtual in libtorch) adds to param_groups() only:
// refuse to step or save a partition that no longer covers them.
void ZeroRedundancyOptimizer::check_partition_current() const {
  bool same = param_groups().size() == owner_.size();
  for (size_t g = 0; same && g < owner_.size(); ++g) {
    same = param_groups()[g].params().size() == owner_[g].size();
  }
  if (!same) {
    throw InvalidArgument(
        "ZeroRedundancyOptimizer: parameters were added after construction "
        "(add_param_group), which the partition does not cover; construct the optimizer with "
        "every parameter group instead");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::sync_options_to_local() const {
  auto& local = local_->param_groups();
  for (size_t g = 0; g < local.size(); ++g) {
    local[g].set_options(param_groups()[g].options().clone());
  }
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  check_partition_current();
  sync_options_to_local();
  at::Tensor loss = local_->step(std::move(closure));
  if (consolidated_) {  // stale now: do not hold a full state for nothing
    consolidated_.reset();
    dropped_by_step_ = true;
  }
  broadcast_shards();
  return loss;
}

void ZeroRedundancyOptimizer::main_hook() { step(); }

void ZeroRedundancyOptimizer::broadcast_shards() {
  if (!group_ || group_->size() == 1) return;
  for (int r = 0; r < group_->size(); ++r) {
    const auto& shard = shard_of_rank_[static_cast<size_t>(r)];
    if (!shard.empty()) detail::broadcast_coalesced(shard, r, on(group_), kBroadcastChunkBytes);
  }
}

int64_t ZeroRedundancyOptimizer::state_bytes() const { return optimizer_state_bytes(*local_); }

namespace {

int64_t bytes_of(std::initializer_list<const at::Tensor*> tensors) {
  int64_t n = 0;
  for (const at::Tensor* t : tensors) n += t->defined() ? static_cast<int64_t>(t->nbytes()) : 0;
  return n;
}

// The tensors of one built-in parameter state, counted where they are (no
// copy: a report must not raise the memory it reports); -1 for others.
int64_t state_bytes_of(const optim::OptimizerParamState& s) {
  if (auto* p = dynamic_cast<const optim::SGDParamState*>(&s)) return bytes_of({&p->momentum_buffer()});
  if (auto* p = dynamic_cast<const optim::AdamParamState*>(&s)) {
    return bytes_of({&p->exp_avg(), &p->exp_avg_sq(), &p->max_exp_avg_sq()});
  }
  if (auto* p = dynamic_cast<const optim::AdamWParamState*>(&s)) {
    return bytes_of({&p->exp_avg(), &p->exp_avg_sq(), &p->max_exp_avg_sq()});
  }
  if (auto* p = dynamic_cast<const optim::AdagradParamState*>(&s)) return bytes_of({&p->sum()});
  if (auto* p = dynamic_cast<const optim::RMSpropParamState*>(&s)) {
    return bytes_of({&p->square_avg(), &p->momentum_buffer(), &p->grad_avg()});
  }
  return -1;
}

}  // namespace

int64_t optimizer_state_bytes(const optim::Optimizer& optimizer) {
  if (auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) {
    return zero->state_bytes();
  }
  int64_t bytes = 0;
  for (const auto& entry : optimizer.state()) {
    const int64_t b = state_bytes_of(*entry.second);
    if (b < 0) return -1;
    bytes += b;
  }
  return bytes;
}

}  // namespace ddp
