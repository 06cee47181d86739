// new_group: subgroups over the parent's store (subgroup.h).
#include "ddp/subgroup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "compat/torch_compat.h"
#include "ddp/error.h"
#include "process_group_impl.h"

namespace ddp {
namespace {

std::vector<int> checked_ranks(std::vector<int> ranks, const detail::ProcessGroupImpl& parent) {
  if (ranks.empty()) {
    throw InvalidArgument("new_group: ranks is empty; pass the parent's ranks of the subgroup");
  }
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= parent.size) {
      throw InvalidArgument(fmt::format("new_group: rank {} is not a rank of the parent group "
                                        "(size {})", ranks[i], parent.size));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw InvalidArgument(fmt::format("new_group: rank {} is given twice", ranks[i]));
    }
  }
  return ranks;
}

}  // namespace

ProcessGroupPtr new_group(const std::vector<int>& given, const NewGroupOptions& options) {
  ProcessGroupPtr parent_ptr = options.parent ? options.parent : default_group();
  detail::ProcessGroupImpl& parent = parent_ptr->impl();
  if (parent.rank < 0) throw InvalidArgument("new_group: " + parent.not_member);
  const std::vector<int> ranks = checked_ranks(given, parent);
  const uint64_t number = parent.next_subgroup++;
  const std::string label = fmt::format(
      "subgroup {} (parent ranks {})",
      options.name.empty() ? std::to_string(number) : "'" + options.name + "'",
      fmt::join(ranks, ", "));
  auto impl = std::make_unique<detail::ProcessGroupImpl>();
  impl->size = static_cast<int>(ranks.size());
  impl->backend_name = parent.backend_name;
  impl->device = parent.device;
  impl->address = fmt::format("{}, {}", parent.address, label);
  impl->timeout = options.timeout.value_or(parent.timeout);
  impl->debug = parent.debug;
  impl->shm_off_reason = "a subgroup (new_group): its collectives go through " +
                         parent.backend_name;
  auto me = std::find(ranks.begin(), ranks.end(), parent.rank);
  if (me == ranks.end()) {
    impl->rank = -1;
    impl->not_member = fmt::format(
        "rank {} of the parent group is not a member of {}: call its collectives on its "
        "members only (is_member())", parent.rank, label);
    return std::make_shared<ProcessGroup>(std::move(impl));
  }
  impl->rank = static_cast<int>(me - ranks.begin());
  const std::string prefix = fmt::format("ddp_subgroup/{}", number);
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, parent.store);
  impl->publish_store = c10::make_intrusive<c10d::PrefixStore>(
      prefix, parent.publish_store ? parent.publish_store : parent.store);
  impl->gloo_address = parent.gloo_address;
  impl->gloo_threads = parent.gloo_threads;
  impl->monitor_options = parent.monitor_options;
  try {
    impl->backend = parent.backend_name == "nccl"
                        ? compat::make_nccl(impl->store, impl->rank, impl->size, impl->timeout,
                                            impl->device)
                        : compat::make_gloo(impl->store, impl->rank, impl->size,
                                            impl->gloo_address, impl->gloo_threads,
                                            impl->timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("new_group: rank {} could not connect {} within {} ms: {}. Every "
                                "rank of the parent must call new_group with the same ranks",
                                parent.rank, label, impl->timeout.count(),
                                compat::what_without_backtrace(e)));
  }
  if (impl->size > 1) {
    impl->monitor = std::make_unique<detail::CollectiveMonitor>(
        impl->store, impl->publish_store, impl->rank, impl->size, impl->monitor_options);
  }
  return std::make_shared<ProcessGroup>(std::move(impl));
}

bool is_member(const ProcessGroup& group) { return group.rank() >= 0; }

ProcessGroupPtr split_group(const std::vector<std::vector<int>>& split_ranks,
                            const NewGroupOptions& options) {
  ProcessGroupPtr parent = options.parent ? options.parent : default_group();
  if (parent->impl().rank < 0) throw InvalidArgument("split_group: " + parent->impl().not_member);
  std::vector<int> list_of(parent->size(), -1);
  for (size_t i = 0; i < split_ranks.size(); ++i) {
    for (int r : checked_ranks(split_ranks[i], parent->impl())) {
      if (list_of[r] >= 0 && list_of[r] != static_cast<int>(i)) {
        throw InvalidArgument(fmt::format(
            "split_group: rank {} is in split_ranks[{}] and split_ranks[{}]: the subgroups of "
            "a split are disjoint (use new_group for overlapping ones)",
            r, list_of[r], i));
      }
      list_of[r] = static_cast<int>(i);
    }
  }
  ProcessGroupPtr mine;
  for (size_t i = 0; i < split_ranks.size(); ++i) {
    NewGroupOptions o = options;
    o.parent = parent;
    if (!options.name.empty()) o.name = fmt::format("{}[{}]", options.name, i);
    ProcessGroupPtr g = new_group(split_ranks[i], o);
    if (is_member(*g)) mine = g;
  }
  return mine;
}

}  // namespace ddp
