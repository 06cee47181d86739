// ZeroRedundancyOptimizer: partition, sharded step, and the full state
// gathered to one rank and split again (Note [ZeRO state]).
#include "ddp/zero_redundancy_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/serialize/archive.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include "checkpoint/checkpoint_format.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "model_sync.h"

namespace ddp {
namespace {

namespace optim = torch::optim;

// Note [ZeRO state]
// The full state is an OptimizerSnapshot (checkpoint_format.h) of the
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

// What every rank must agree on: groups, parameters, elements.
struct Shape {
  int64_t groups, params, numel, fingerprint;
};

Shape shape_of(const std::vector<optim::OptimizerParamGroup>& groups) {
  Shape s{static_cast<int64_t>(groups.size()), 0, 0, 0};
  for (const auto& g : groups) {
    for (const at::Tensor& p : g.params()) {
      ++s.params;
      s.numel += p.numel();
      s.fingerprint = s.fingerprint * 1000003 + p.numel() * 31 + p.dim();
    }
    s.fingerprint = s.fingerprint * 1000003 + 7;
  }
  return s;
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
      group_(options.group ? options.group : (is_initialized() ? default_group() : nullptr)) {
  const int world = group_ ? group_->size() : 1;
  check_params_on_every_rank();
  if (world > 1) {
    const Shape mine = shape_of(param_groups());
    const auto all = all_gather_value(mine, on(group_));
    for (int r = 0; r < world; ++r) {
      const Shape& s = all[static_cast<size_t>(r)];
      if (s.groups != mine.groups || s.params != mine.params || s.numel != mine.numel ||
          s.fingerprint != mine.fingerprint) {
        throw MismatchError(fmt::format(
            "ZeroRedundancyOptimizer: rank {} has {} group(s), {} parameter(s), {} element(s), "
            "but rank {} has {}, {}, {} (or other shapes): every rank must pass the same "
            "parameters in the same order",
            group_->rank(), mine.groups, mine.params, mine.numel, r, s.groups, s.params, s.numel));
      }
    }
  }
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
