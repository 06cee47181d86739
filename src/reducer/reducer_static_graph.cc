// Reducer: static_graph, Note [Static graph] (reducer.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ddp/error.h"
#include "reducer/reducer_state.h"

namespace ddp::detail {

bool Reducer::static_learning() const { return static_ && !static_->learned; }

// Called under mu_ for every gradient hook of a synchronised backward.
// Returns whether the parameter is ready now (its last expected hook).
bool Reducer::static_graph_hook(size_t index) {
  const int seen = ++iter_->hooks_seen[index];
  if (!static_->learned) {
    static_->last_fired[index] = ++static_->fire_clock;
    return false;  // learning: everything is reduced in finalize_backward()
  }
  const int expected = static_->hooks_expected[index];
  if (seen == expected) return true;
  if (seen == expected + 1) {  // reported once per parameter
    iter_->static_changes.push_back(fmt::format(
        "  {}: {} in the first iteration, now at least {}", params_[index].name,
        expected == 0 ? "unused" : fmt::format("{} gradient(s)", expected), seen));
  }
  return false;
}

std::vector<size_t> Reducer::static_unused() const {
  std::vector<size_t> unused;
  if (!static_ || !static_->learned) return unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (static_->hooks_expected[i] == 0) unused.push_back(i);
  }
  return unused;
}

// End of the learning backward: the counts, and the rebuild order (the
// unused parameters first, as they are marked ready at the first hook, then
// the order of each parameter's last hook, when it becomes ready).
void Reducer::learn_static_graph() {
  static_->hooks_expected = iter_->hooks_seen;
  static_->learned = true;
  if (rebuild_.done) return;
  std::vector<size_t> fired;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (iter_->hooks_seen[i] > 0) fired.push_back(i);
  }
  const std::vector<uint64_t>& last = static_->last_fired;
  std::sort(fired.begin(), fired.end(), [&](size_t a, size_t b) { return last[a] < last[b]; });
  rebuild_.order = static_unused();
  rebuild_.order.insert(rebuild_.order.end(), fired.begin(), fired.end());
}

void Reducer::check_static_graph(bool learned_now) {
  if (!static_ || learned_now) return;
  std::vector<std::string>& changes = iter_->static_changes;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int seen = iter_->hooks_seen[i], expected = static_->hooks_expected[i];
    if (seen < expected) {
      changes.push_back(fmt::format("  {}: {} gradient(s) in the first iteration, now {}",
                                    params_[i].name, expected, seen));
    }
  }
  if (changes.empty()) return;
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
