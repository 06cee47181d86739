// fully_shard's optimizer state in full (FSDP2's get/set_optimizer_state_dict
// with full_state_dict), and the sharded root a checkpoint saves through
// (fsdp/fsdp_checkpoint.h).
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "fsdp/fsdp_checkpoint.h"
#include "fsdp/fsdp_unit.h"
#include "optimizer_state.h"

namespace ddp {
namespace {

using detail::FsdpParam;

// The sharded parameter behind each of the optimizer's parameters (groups
// flattened, in order); null for a tensor no unit of root's tree shards.
std::vector<const FsdpParam*> placed_params(detail::FsdpUnit& root,
                                            const torch::optim::Optimizer& optimizer) {
  const detail::ParamIndex index = detail::param_index(root);
  std::vector<const FsdpParam*> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      auto it = index.find(p.unsafeGetTensorImpl());
      out.push_back(it == index.end() ? nullptr
                                      : &it->second.first->params()[it->second.second]);
    }
  }
  return out;
}

void require_field_by_field(const OptimizerState& s, const char* what) {
  if (s.type.rfind("archive:", 0) == 0) {
    throw InvalidArgument(fmt::format(
        "{}: the optimizer is {}, whose state ddp keeps only as libtorch's archive bytes, so "
        "its shards cannot be gathered or cut; use SGD, Adam, AdamW, Adagrad or RMSprop",
        what, s.type.substr(8)));
  }
}

std::string param_name(const FsdpParam* p, size_t i) {
  return p ? "'" + p->name + "'" : "optimizer parameter " + std::to_string(i);
}

// Calls f(field, placed parameter, flat index) for every tensor field.
template <typename F>
void for_each_tensor(OptimizerState& s, const std::vector<const FsdpParam*>& placed, F f) {
  size_t i = 0;
  for (auto& group : s.groups) {
    for (auto& state : group.state) {
      if (state) {
        for (OptimizerField& field : *state) {
          if (field.kind == OptimizerField::Kind::kTensor && field.tensor.defined()) {
            f(field, placed[i], i);
          }
        }
      }
      ++i;
    }
  }
}

bool is_shard_state(const OptimizerField& f, const FsdpParam* p) {
  return p != nullptr && f.tensor.sizes() == c10::IntArrayRef(p->layout.shard_sizes);
}

// One line per optimizer parameter: which fields it has and which of them
// are gathered. Every rank must have the same lines, or the gathers would
// not line up.
std::vector<std::string> state_outline(OptimizerState& s,
                                       const std::vector<const FsdpParam*>& placed) {
  std::vector<std::string> lines;
  for (const auto& group : s.groups) {
    for (const auto& state : group.state) {
      std::string line = state ? "state:" : "none";
      if (state) {
        for (const OptimizerField& f : *state) line += " " + f.name;
      }
      lines.push_back(line);
    }
  }
  for_each_tensor(s, placed, [&](OptimizerField& f, const FsdpParam* p, size_t i) {
    lines[i] += is_shard_state(f, p) ? " " + f.name + "=shard" : "";
  });
  return lines;
}

void check_outlines_agree(OptimizerState& s, const std::vector<const FsdpParam*>& placed,
                          const ProcessGroupPtr& group) {
  const std::vector<std::string> mine = state_outline(s, placed);
  std::string joined;
  for (const std::string& l : mine) joined += l + "\n";
  const std::vector<std::string> all = all_gather_string(joined, {group});
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::string& first = all[0];
    size_t line = 0, at = 0;
    while (at < first.size() && at < all[r].size() && first[at] == all[r][at]) {
      if (first[at++] == '\n') ++line;
    }
    throw MismatchError(fmt::format(
        "full_optimizer_state_dict: rank {}'s optimizer state differs from rank 0's at {} (a "
        "step taken on some ranks only, or optimizers built differently): every rank must "
        "step the same optimizer on the same parameters",
        r, param_name(line < placed.size() ? placed[line] : nullptr, line)));
  }
}

}  // namespace

OptimizerState full_optimizer_state_dict(FullyShardUnit& root,
                                         const torch::optim::Optimizer& optimizer) {
  const char* what = "full_optimizer_state_dict";
  detail::FsdpUnit& s = detail::sharded_root(root, what);
  OptimizerState state = detail::capture_optimizer(optimizer);
  require_field_by_field(state, what);
  const std::vector<const FsdpParam*> placed = placed_params(s, optimizer);
  check_outlines_agree(state, placed, s.group());
  for_each_tensor(state, placed, [&](OptimizerField& f, const FsdpParam* p, size_t) {
    if (is_shard_state(f, p)) f.tensor = detail::gather_rows(p->layout, f.tensor, s.group());
  });
  return state;
}

void load_full_optimizer_state_dict(FullyShardUnit& root, torch::optim::Optimizer& optimizer,
                                    const OptimizerState& state, const std::string& source) {
  const char* what = "load_full_optimizer_state_dict";
  detail::FsdpUnit& s = detail::sharded_root(root, what);
  require_field_by_field(state, what);
  const std::vector<const FsdpParam*> placed = placed_params(s, optimizer);
  size_t n = 0;
  for (const auto& g : state.groups) n += g.state.size();
  if (n != placed.size()) {
    throw InvalidArgument(fmt::format(
        "{}: '{}' holds state for {} parameters, the optimizer has {}: load the state of "
        "an optimizer over this model's parameters; nothing was loaded",
        what, source, n, placed.size()));
  }
  // The optimizer's checks compare with the parameters' shapes: shards.
  s.tree()->reshard_all();
  OptimizerState mine = state;
  const int rank = s.group()->rank();
  for_each_tensor(mine, placed, [&](OptimizerField& f, const FsdpParam* p, size_t) {
    if (p != nullptr && f.tensor.sizes() == c10::IntArrayRef(p->layout.full_sizes)) {
      f.tensor = detail::local_rows(p->layout, f.tensor, rank);
    }
  });
  detail::restore_optimizer(mine, optimizer, source);
}

namespace detail {

FullyShardUnit* checkpoint_root(const torch::nn::Module& model, const char* what) {
  auto* unit = dynamic_cast<FullyShardUnit*>(const_cast<torch::nn::Module*>(&model));
  if (unit != nullptr && unit->is_sharded()) {
    if (unit->fsdp_state()->is_root()) return unit;
    throw InvalidArgument(fmt::format(
        "{}: the model is the sharded unit {}, which sits inside another unit: pass the root "
        "unit (the one sharded last), whose tree holds every shard",
        what, unit_name_of(model)));
  }
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* inner = dynamic_cast<FullyShardUnit*>(item.value().get());
    if (inner != nullptr && inner->is_sharded()) {
      throw InvalidArgument(fmt::format(
          "{}: the model's unit '{}' is sharded but the model itself is not: its parameters "
          "hold shards; fully_shard the model too (its root unit), or save before sharding",
          what, item.key()));
    }
  }
  return nullptr;
}

std::vector<ShardedParam> sharded_params(FullyShardUnit& root) {
  FsdpUnit& s = sharded_root(root, "sharded checkpoint");
  for (const auto& w : s.tree()->units) {
    auto u = w.lock();
    if (u->group()->size() != s.group()->size() || u->group()->rank() != s.group()->rank()) {
      throw InvalidArgument(fmt::format(
          "sharded checkpoint: unit {} shards over a group of {} ranks (this rank {}), the "
          "root over {} (rank {}): a sharded checkpoint needs one group for the whole tree; "
          "use save_checkpoint (full state)",
          u->name(), u->group()->size(), u->group()->rank(), s.group()->size(),
          s.group()->rank()));
    }
  }
  s.tree()->reshard_all();
  const ParamIndex index = param_index(s);
  std::vector<ShardedParam> out;
  for (const auto& item : root.unit_module().named_parameters(/*recurse=*/true)) {
    auto [unit, i] = index.at(item.value().unsafeGetTensorImpl());
    const FsdpParam& p = unit->params()[i];
    out.push_back({item.key(), p.shard, p.layout});
  }
  return out;
}

std::vector<std::optional<ParamShard>> optimizer_layouts(FullyShardUnit& root,
                                                         const torch::optim::Optimizer& optimizer) {
  std::vector<std::optional<ParamShard>> out;
  for (const FsdpParam* p : placed_params(sharded_root(root, "sharded checkpoint"), optimizer)) {
    out.push_back(p ? std::optional<ParamShard>(p->layout) : std::nullopt);
  }
  return out;
}

ProcessGroupPtr tree_group(FullyShardUnit& root) {
  return sharded_root(root, "sharded checkpoint").group();
}

std::vector<std::pair<std::string, at::Tensor>> full_shape_state(FullyShardUnit& root) {
  FsdpUnit& s = sharded_root(root, "full_shape_state");
  const ParamIndex index = param_index(s);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : root.unit_module().named_parameters(/*recurse=*/true)) {
    auto [unit, i] = index.at(item.value().unsafeGetTensorImpl());
    out.emplace_back(item.key(), at::zeros({}, item.value().options())
                                     .expand(unit->params()[i].layout.full_sizes));
  }
  for (const auto& item : root.unit_module().named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace detail
}  // namespace ddp
