// Sharded checkpoints of fully_shard models (include/ddp/sharded_checkpoint.h):
// every rank writes its own shards; a rank that loads copies the rows of its
// shards out of each saved rank's file in turn, whatever world size saved it.
#include "ddp/sharded_checkpoint.h"

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <tuple>
#include <vector>

#include "checkpoint_files.h"
#include "checkpoint_format.h"
#include "compat/filesystem_compat.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "error_signs.h"
#include "fsdp/fsdp_checkpoint.h"
#include "optimizer_state.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using detail::ParamShard;

constexpr const char* kIndexSuffix = ".ddpshards";
constexpr const char* kShardsSuffix = ".shards";
constexpr const char* kWorldKey = "ddp.sharded_world_size";

std::string rank_file(int rank) { return "rank-" + std::to_string(rank) + ".ddpckpt"; }

// The rows [first, first + count) that rank `rank` of `world` holds of a
// parameter of `rows` rows: torch.chunk's layout (shard_layout.h).
struct Rows {
  int64_t first = 0, count = 0;
};
Rows rows_of(const ParamShard& l, int world, int rank) {
  const int64_t chunk = (l.rows + world - 1) / world;
  const int64_t first = std::min<int64_t>(rank * chunk, l.rows);
  return {first, std::min(chunk, l.rows - first)};
}

// The shard's shape at (world, rank): [count, rest...] ([count] for 0-dim).
std::vector<int64_t> shard_shape(const ParamShard& l, int world, int rank) {
  std::vector<int64_t> shape = l.full_sizes;
  if (shape.empty()) shape.push_back(1);
  shape[0] = rows_of(l, world, rank).count;
  return shape;
}

// Copies the rows `from` (rank q of the saved world) holds that `to` (this
// rank's new shard) needs.
void copy_overlap(const ParamShard& l, const at::Tensor& from, Rows from_rows, at::Tensor& to,
                  Rows to_rows) {
  const int64_t lo = std::max(from_rows.first, to_rows.first);
  const int64_t hi = std::min(from_rows.first + from_rows.count, to_rows.first + to_rows.count);
  if (hi <= lo || l.row_numel == 0) return;
  to.view({to_rows.count, l.row_numel})
      .narrow(0, lo - to_rows.first, hi - lo)
      .copy_(from.reshape({from_rows.count, l.row_numel}).narrow(0, lo - from_rows.first, hi - lo));
}

// Runs `fn` on every rank of `group`; then every rank learns every rank's
// outcome: it rethrows its own error, or names the first rank that failed.
void on_every_rank(const ProcessGroupPtr& group, const std::string& what,
                   const std::function<void()>& fn) {
  std::exception_ptr failure;
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    error = e.what()[0] != '\0' ? e.what() : "unknown error";
  }
  const std::vector<std::string> errors = all_gather_string(error, {group});
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    throw InvalidArgument(fmt::format("rank {} could not {}: {} ({}: it is collective, so every "
                                      "rank fails with it)",
                                      r, what, errors[r], detail::kReportedByAnotherRank));
  }
}

struct ListedIndex {
  int64_t epoch = 0, step = 0;
  std::string path;
};

std::vector<ListedIndex> list_indices(const std::string& dir) {
  std::vector<ListedIndex> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    long long epoch = 0, step = 0;
    char tail[16] = {0};
    if (std::sscanf(name.c_str(), "checkpoint-epoch%6lld-step%12lld%15s", &epoch, &step, tail) != 3 ||
        std::string(tail) != kIndexSuffix || name != detail::checkpoint_stem(epoch, step) + kIndexSuffix) {
      continue;
    }
    out.push_back({epoch, step, entry.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const ListedIndex& a, const ListedIndex& b) {
    return std::tie(a.epoch, a.step) < std::tie(b.epoch, b.step);
  });
  return out;
}

std::string shards_dir_of(const std::string& index_path) {
  return index_path.substr(0, index_path.size() - std::string(kIndexSuffix).size()) + kShardsSuffix;
}

void remove_sharded(const std::string& index_path) {
  fs::remove(index_path);
  compat::remove_tree(shards_dir_of(index_path));  // Note [remove_all and libtorch 2.11]
}

// This rank's part: its shards, the buffers, its optimizer state and RNG.
std::string rank_bytes(FullyShardUnit& root, const torch::optim::Optimizer* optimizer,
                       int64_t epoch, int64_t step) {
  Checkpoint c;
  c.epoch = epoch;
  c.step = step;
  const at::TensorOptions cpu = at::TensorOptions().device(at::kCPU);
  for (const auto& p : detail::sharded_params(root)) {
    c.model.insert(p.name, p.shard.detach().to(cpu, false, /*copy=*/true));
  }
  for (const auto& b : root.unit_module().named_buffers(/*recurse=*/true)) {
    if (b.value().defined()) c.model.insert(b.key(), b.value().detach().to(cpu, false, true));
  }
  if (optimizer != nullptr) {
    c.optimizer = std::make_shared<const OptimizerState>(detail::capture_optimizer(*optimizer));
  }
  c.rng.push_back(detail::capture_rng());
  return detail::serialize_checkpoint(c);
}

// What this rank takes from the saved files; built before anything changes.
struct Loaded {
  ShardedCheckpointInfo info;
  std::vector<detail::ShardedParam> params;  // the live shards
  std::vector<at::Tensor> shards;            // their new values
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (live, saved)
  std::optional<OptimizerState> optimizer;
  // Shard-shaped optimizer fields: (flat parameter index, group, index in
  // group, field index).
  struct Mark {
    size_t param, group, index, field;
  };
  std::vector<Mark> marks;
  std::vector<std::optional<ParamShard>> layouts;
  std::optional<RngState> rng;
};

void take_optimizer_template(Loaded& L, const OptimizerState& saved, int old_world, int rank,
                             int world) {
  L.optimizer = saved;
  size_t j = 0;
  for (size_t g = 0; g < L.optimizer->groups.size(); ++g) {
    auto& states = L.optimizer->groups[g].state;
    for (size_t i = 0; i < states.size(); ++i, ++j) {
      if (!states[i] || j >= L.layouts.size() || !L.layouts[j]) continue;
      const ParamShard& l = *L.layouts[j];
      for (size_t f = 0; f < states[i]->size(); ++f) {
        at::Tensor& t = (*states[i])[f].tensor;
        if (!t.defined() || t.sizes() != c10::IntArrayRef(shard_shape(l, old_world, 0))) continue;
        t = at::zeros(shard_shape(l, world, rank), t.options());
        L.marks.push_back({j, g, i, f});
      }
    }
  }
}

void take_file(Loaded& L, const std::string& file, int q, int old_world, int rank, int world,
               FullyShardUnit& root) {
  const Checkpoint c = detail::parse_checkpoint(detail::read_whole_file(file), file);
  auto another_model = [&](const std::string& what) {
    return InvalidArgument(fmt::format("sharded checkpoint file '{}' {}: it was saved from another "
                                       "model; load it into the model it was saved from",
                                       file, what));
  };
  for (size_t i = 0; i < L.params.size(); ++i) {
    const detail::ShardedParam& p = L.params[i];
    const at::Tensor* t = c.model.find(p.name);
    const std::vector<int64_t> want = shard_shape(p.layout, old_world, q);
    if (t == nullptr) throw another_model("has no parameter '" + p.name + "'");
    if (t->sizes() != c10::IntArrayRef(want)) {
      throw another_model(fmt::format("holds '{}' as {}, but rank {} of {} holds {} of this model's",
                                      p.name, c10::str(t->sizes()), q, old_world,
                                      c10::str(c10::IntArrayRef(want))));
    }
    copy_overlap(p.layout, *t, rows_of(p.layout, old_world, q), L.shards[i],
                 rows_of(p.layout, world, rank));
  }
  if (q == 0) {
    for (const auto& b : root.unit_module().named_buffers(/*recurse=*/true)) {
      const at::Tensor* t = c.model.find(b.key());
      if (t == nullptr || t->sizes() != b.value().sizes()) {
        throw another_model("has no buffer '" + b.key() + "' of shape " + c10::str(b.value().sizes()));
      }
      L.buffers.emplace_back(b.value(), *t);
    }
    if (L.optimizer && c.optimizer) take_optimizer_template(L, *c.optimizer, old_world, rank, world);
    if (L.optimizer && !c.optimizer) L.optimizer.reset();  // saved without one
  }
  for (const Loaded::Mark& m : L.marks) {
    const auto& state = c.optimizer ? c.optimizer->groups.at(m.group).state.at(m.index)
                                    : std::optional<OptimizerFields>();
    const ParamShard& l = *L.layouts[m.param];
    if (!state || state->size() <= m.field ||
        state->at(m.field).tensor.sizes() != c10::IntArrayRef(shard_shape(l, old_world, q))) {
      throw another_model(fmt::format("has optimizer state of parameter {} unlike saved rank 0's",
                                      m.param));
    }
    copy_overlap(l, state->at(m.field).tensor, rows_of(l, old_world, q),
                 (*L.optimizer->groups[m.group].state[m.index])[m.field].tensor,
                 rows_of(l, world, rank));
  }
  if (q == rank && old_world == world && !c.rng.empty()) L.rng = c.rng[0];
}

}  // namespace

std::string save_sharded_checkpoint(const std::string& dir, FullyShardUnit& root,
                                    const torch::optim::Optimizer* optimizer, int64_t epoch,
                                    int64_t step, const ShardedSaveOptions& options) {
  if (epoch < 0 || step < 0) {
    throw InvalidArgument(fmt::format(
        "save_sharded_checkpoint: epoch ({}) and step ({}) must be >= 0", epoch, step));
  }
  const ProcessGroupPtr group = detail::tree_group(root);
  const int rank = group->rank(), world = group->size();
  const std::string stem = detail::checkpoint_stem(epoch, step);
  const std::string index = dir + "/" + stem + kIndexSuffix;
  const std::string shards = dir + "/" + stem + kShardsSuffix;
  const std::string what = "save sharded checkpoint '" + index + "'";
  // An index names a complete set: the old one goes before any file changes.
  on_every_rank(group, what, [&] {
    if (rank != 0) return;
    detail::ensure_directory(dir);
    remove_sharded(index);
  });
  on_every_rank(group, what, [&] {
    const std::string bytes = rank_bytes(root, optimizer, epoch, step);
    detail::ensure_directory(shards);
    detail::write_file_atomically(shards, rank_file(rank), bytes.data(), bytes.size());
  });
  on_every_rank(group, what, [&] {
    if (rank != 0) return;
    Checkpoint c;
    c.epoch = epoch;
    c.step = step;
    c.metadata = options.metadata;
    c.metadata[kWorldKey] = std::to_string(world);
    const std::string bytes = detail::serialize_checkpoint(c);
    detail::write_file_atomically(dir, stem + kIndexSuffix, bytes.data(), bytes.size());
    const std::vector<ListedIndex> all = list_indices(dir);
    for (size_t i = 0; options.keep_last > 0 && i + options.keep_last < all.size(); ++i) {
      remove_sharded(all[i].path);
    }
  });
  return index;
}

ShardedCheckpointInfo load_sharded_checkpoint(const std::string& path, FullyShardUnit& root,
                                              torch::optim::Optimizer* optimizer) {
  const ProcessGroupPtr group = detail::tree_group(root);
  const int rank = group->rank(), world = group->size();
  const std::string what = "load sharded checkpoint '" + path + "'";
  Loaded L;
  on_every_rank(group, what, [&] {
    const Checkpoint index = detail::parse_checkpoint(detail::read_whole_file(path), path);
    auto it = index.metadata.find(kWorldKey);
    int old_world = 0;
    if (it != index.metadata.end()) old_world = std::atoi(it->second.c_str());
    if (old_world < 1) {
      throw InvalidArgument("'" + path + "' is not the index of a sharded checkpoint (no '" +
                            kWorldKey + "'): load it with load_checkpoint");
    }
    L.info = {path, index.epoch, index.step, old_world, index.metadata};
    L.info.metadata.erase(kWorldKey);
    L.params = detail::sharded_params(root);
    for (const auto& p : L.params) L.shards.push_back(at::zeros(p.layout.shard_sizes, p.shard.options()));
    if (optimizer != nullptr) {
      L.layouts = detail::optimizer_layouts(root, *optimizer);
      L.optimizer.emplace();  // replaced by saved rank 0's, if it has one
    }
    for (int q = 0; q < old_world; ++q) {
      take_file(L, shards_dir_of(path) + "/" + rank_file(q), q, old_world, rank, world, root);
    }
  });
  // The optimizer checks its state against itself before changing anything.
  on_every_rank(group, what, [&] {
    if (optimizer != nullptr && L.optimizer) detail::restore_optimizer(*L.optimizer, *optimizer, path);
  });
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < L.params.size(); ++i) L.params[i].shard.copy_(L.shards[i]);
  for (auto& [live, saved] : L.buffers) live.copy_(saved);
  if (L.rng) detail::restore_rng(*L.rng, path);
  return L.info;
}

std::optional<std::string> latest_sharded_checkpoint_path(const std::string& dir) {
  const std::vector<ListedIndex> all = list_indices(dir);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

}  // namespace ddp
