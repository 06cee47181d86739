// Reducer: static_graph, Note [Static graph] (reducer.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ddp/error.h"
#include "reducer_state.h"

namespace ddp::detail {

// Called under mu_ for every gradient hook of a synchronised backward.
// Returns whether the parameter is ready now (its last expected hook).
bool Reducer::static_graph_hook(size_t index) {
  const int seen = ++hooks_seen_[index];
  if (!static_learned_) {
    last_fired_[index] = ++fire_clock_;
    return false;  // learning: everything is reduced in finalize_backward()
  }
  const int expected = hooks_expected_[index];
  if (seen == expected) return true;
  if (seen == expected + 1) {  // reported once per parameter
    static_changes_.push_back(fmt::format(
        "  {}: {} in the first iteration, now at least {}", params_[index].name,
        expected == 0 ? "unused" : fmt::format("{} gradient(s)", expected), seen));
  }
  return false;
}

std::vector<size_t> Reducer::static_unused() const {
  std::vector<size_t> unused;
  if (!static_learned_) return unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hooks_expected_[i] == 0) unused.push_back(i);
  }
  return unused;
}

// End of the learning backward: the counts, and the rebuild order (the
// unused parameters first, as they are marked ready at the first hook, then
// the order of each parameter's last hook, when it becomes ready).
void Reducer::learn_static_graph() {
  hooks_expected_ = hooks_seen_;
  static_learned_ = true;
  if (rebuild_done_) return;
  std::vector<size_t> fired;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hooks_seen_[i] > 0) fired.push_back(i);
  }
  std::sort(fired.begin(), fired.end(),
            [&](size_t a, size_t b) { return last_fired_[a] < last_fired_[b]; });
  ready_order_ = static_unused();
  ready_order_.insert(ready_order_.end(), fired.begin(), fired.end());
}

void Reducer::check_static_graph(bool learned_now) {
  if (!options_.static_graph || learned_now) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int seen = hooks_seen_[i], expected = hooks_expected_[i];
    if (seen < expected) {
      static_changes_.push_back(fmt::format("  {}: {} gradient(s) in the first iteration, now {}",
                                            params_[i].name, expected, seen));
    }
  }
  if (static_changes_.empty()) return;
  std::vector<std::string> changes = std::move(static_changes_);
  static_changes_.clear();
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel(static_graph=true): the autograd graph of backward pass {} "
      "differs from the first iteration's on this rank (gradients per parameter):\n{}\n"
      "The gradients were reduced as the first iteration's graph says, so they are wrong "
      "for this iteration. static_graph requires the same parameters to be used the same "
      "number of times every iteration; for a graph that changes, use "
      "find_unused_parameters = true instead",
      iterations_ - 1, fmt::join(changes, "\n")));
}

}  // namespace ddp::detail
