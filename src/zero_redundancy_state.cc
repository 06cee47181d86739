// ZeroRedundancyOptimizer's full state: consolidation on one rank, loading
// with re-sharding, torch::save/load (Note [ZeRO state] in
// zero_redundancy_optimizer.cc).
#include <ATen/ops/empty.h>
#include <torch/serialize/archive.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "call_scope.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "optimizer_state.h"

namespace ddp {
namespace {


constexpr const char* kArchiveKey = "ddp_zero_redundancy_optimizer_state";

std::string to_bytes(const OptimizerState& s) {
  detail::ByteWriter w;
  detail::write_optimizer(w, s);
  return std::move(w.bytes());
}

OptimizerState from_bytes(const char* data, size_t size, const std::string& source) {
  detail::ByteReader r(data, size, source);
  return detail::read_optimizer(r, at::kCPU);
}

// Every rank's bytes on rank `to` (indexed by rank; empty elsewhere): sizes
// first, then one gather of buffers padded to the largest.
std::vector<std::string> gather_bytes(const std::string& mine, int to, const ProcessGroupPtr& g) {
  CollectiveOptions o{g, std::nullopt};
  const auto sizes = all_gather_value<int64_t>(static_cast<int64_t>(mine.size()), o);
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  std::vector<at::Tensor> all = gather(buf, to, o);
  std::vector<std::string> out;
  for (size_t r = 0; r < all.size(); ++r) {
    out.emplace_back(static_cast<const char*>(all[r].data_ptr()), static_cast<size_t>(sizes[r]));
  }
  return out;
}

}  // namespace

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) const {
  const detail::CallScope call(
      "ZeroRedundancyOptimizer::consolidate_state_dict",
      "consolidate_state_dict is collective: every rank of the optimizer's group calls it");
  const int world = group_ ? group_->size() : 1;
  const int rank = group_ ? group_->rank() : 0;
  if (to < 0 || to >= world) {
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer::consolidate_state_dict: to = {} is not a rank of the group "
        "(size {})", to, world));
  }
  check_partition_current();
  sync_options_to_local();
  OptimizerState local = detail::capture_optimizer(*local_);
  if (local.type.rfind("archive:", 0) == 0) {
    throw InvalidArgument(
        "ZeroRedundancyOptimizer::consolidate_state_dict: the shard optimizer is of type " +
        local.type.substr(8) + ", whose state ddp cannot split per parameter; SGD, Adam, AdamW, "
        "Adagrad and RMSprop can be consolidated");
  }
  std::vector<std::string> shards;
  if (world == 1) {
    shards.push_back(to_bytes(local));
  } else {
    shards = gather_bytes(to_bytes(local), to, group_);
  }
  consolidated_.reset();
  dropped_by_step_ = false;
  consolidated_to_ = to;
  if (rank != to) return;
  auto full = std::make_shared<OptimizerState>();
  full->type = local.type;
  for (size_t g = 0; g < owner_.size(); ++g) {
    full->groups.emplace_back();
    full->groups.back().options = local.groups[g].options;
    full->groups.back().state.resize(owner_[g].size());
  }
  for (int r = 0; r < world; ++r) {
    const std::string& b = shards[static_cast<size_t>(r)];
    OptimizerState s = from_bytes(b.data(), b.size(), fmt::format("rank {}'s shard", r));
    for (size_t g = 0; g < owner_.size(); ++g) {
      size_t j = 0;  // the position among rank r's parameters of group g
      for (size_t i = 0; i < owner_[g].size(); ++i) {
        if (owner_[g][i] != r) continue;
        full->groups[g].state[i] = std::move(s.groups.at(g).state.at(j++));
      }
    }
  }
  consolidated_ = std::move(full);
}

std::shared_ptr<const OptimizerState> ZeroRedundancyOptimizer::state_dict() const {
  const int rank = group_ ? group_->rank() : 0;
  if (!consolidated_ && dropped_by_step_) {
    throw InvalidArgument(
        "ZeroRedundancyOptimizer::state_dict: step() ran after consolidate_state_dict(), so "
        "the consolidated state was stale and has been dropped; call "
        "consolidate_state_dict() on every rank again");
  }
  if (!consolidated_ && consolidated_to_ >= 0 && consolidated_to_ != rank) {
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer::state_dict: the state was consolidated on rank {}, not on "
        "this rank ({}): call state_dict() or torch::save there, or consolidate_state_dict({}) "
        "on every rank",
        consolidated_to_, rank, rank));
  }
  if (!consolidated_) {
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer::state_dict: rank {} holds no consolidated state; call "
        "consolidate_state_dict({}) on every rank first",
        rank, rank));
  }
  return consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const OptimizerState& state,
                                              const std::string& source) {
  const std::string where = "ZeroRedundancyOptimizer::load_state_dict: '" + source + "'";
  if (state.type.rfind("archive:", 0) == 0) {
    throw InvalidArgument(where + " is the state of a " + state.type.substr(8) +
                          " optimizer, which ddp cannot split per parameter");
  }
  if (state.groups.size() != owner_.size()) {
    throw InvalidArgument(fmt::format("{} has {} parameter group(s), the optimizer {}", where,
                                      state.groups.size(), owner_.size()));
  }
  // The whole state against every parameter first (each rank holds them
  // all), on a scratch optimizer: a state that does not fit fails on every
  // rank alike, not only on the rank owning the bad entry.
  check_partition_current();
  detail::restore_optimizer(state, *factory_(param_groups()), source);
  const int rank = group_ ? group_->rank() : 0;
  OptimizerState mine;
  mine.type = state.type;
  for (size_t g = 0; g < owner_.size(); ++g) {
    const auto& sg = state.groups[g];
    if (sg.state.size() != owner_[g].size()) {
      throw InvalidArgument(fmt::format("{}: group {} has {} parameter(s), the optimizer's {}",
                                        where, g, sg.state.size(), owner_[g].size()));
    }
    mine.groups.emplace_back();
    mine.groups.back().options = sg.options;
    for (size_t i = 0; i < owner_[g].size(); ++i) {
      if (owner_[g][i] == rank) mine.groups.back().state.push_back(sg.state[i]);
    }
  }
  // Validates everything against the shard's parameters before changing it.
  detail::restore_optimizer(mine, *local_, source);
  for (size_t g = 0; g < owner_.size(); ++g) {
    param_groups()[g].set_options(local_->param_groups()[g].options().clone());
  }
  consolidated_.reset();
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  const std::string bytes = to_bytes(*state_dict());
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  archive.write(kArchiveKey, t);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  at::Tensor t;
  if (!archive.try_read(kArchiveKey, t)) {
    throw InvalidArgument(std::string("ZeroRedundancyOptimizer::load: the archive has no '") +
                          kArchiveKey + "' (it was not written by ZeroRedundancyOptimizer::save)");
  }
  t = t.contiguous();
  load_state_dict(from_bytes(static_cast<const char*>(t.data_ptr()),
                             static_cast<size_t>(t.numel()), "archive"),
                  "archive");
}

}  // namespace ddp
