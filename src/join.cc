// Join: uneven inputs. See join.h for the contract.
//
// Note [Join protocol]
// With join enabled, every synchronised iteration of a rank still training
// starts with an all_reduce (SUM) of 1 from each rank still training and 0
// from each finished rank: the number of ranks still training. Then come, in
// the same order on every rank, the one-time bucket rebuild broadcast, the
// buffer broadcast (an all_reduce MAX to agree on the source, then the
// broadcast) and the gradient buckets' all_reduces. A finished rank loops in
// shadow_iteration() issuing the same sequence with zeros until the count
// is 0, which every rank sees in the same iteration. After each shadow
// iteration the join's other participants (JoinHook: a
// ZeroRedundancyOptimizer's step) shadow theirs, in the order given, as the
// training ranks issue them after their backward.
#include <ATen/ops/full.h>
#include <fmt/format.h>

#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp_core.h"

namespace ddp::detail {

void join(DdpCore& core, const std::function<void()>& loop, const JoinOptions& options,
          const std::vector<JoinHook*>& hooks) {
  if (!options.enable) {
    loop();
    return;
  }
  core.begin_join(options);
  try {
    loop();
    bool last_to_finish = true;
    while (core.shadow_iteration()) {
      last_to_finish = false;
      for (JoinHook* h : hooks) h->main_hook();
    }
    core.sync_final_model(last_to_finish);
  } catch (...) {
    core.end_join();
    throw;
  }
  core.end_join();
}

void DdpCore::begin_join(const JoinOptions& options) {
  if (join_) {
    throw InvalidArgument("ddp::join: this DistributedDataParallel is already inside a join");
  }
  join_ = options;
}

void DdpCore::end_join() {
  join_.reset();
  reducer_->set_iteration_users(group_->size(), group_->size());
}

int DdpCore::count_ranks_training(bool training) {
  at::Tensor t = at::full({1}, training ? 1 : 0, at::kInt);
  all_reduce(t, ReduceOp::SUM, copts_);
  const int n = t.item<int>();
  const int world = group_->size();
  if (join_->throw_on_early_termination && n < world) {
    throw InvalidArgument(fmt::format(
        "ddp::join: {} of {} ranks ran out of inputs (this rank {}); "
        "throw_on_early_termination is set, so every rank stops here",
        world - n, world, training ? "still has inputs" : "is one of them"));
  }
  return n;
}

bool DdpCore::shadow_iteration() {
  const int training = count_ranks_training(false);
  if (training == 0) return false;
  reducer_->prepare_for_forward();  // the one-time rebuild, if due now
  if (buffers_due()) sync_buffers(/*candidate=*/false);
  reducer_->shadow_backward();
  return true;
}

// The authoritative copy: the highest rank among the last to finish.
void DdpCore::sync_final_model(bool is_last_joiner) {
  if (group_->size() == 1) return;
  at::Tensor src = at::full({1}, is_last_joiner ? group_->rank() : -1, at::kInt);
  all_reduce(src, ReduceOp::MAX, copts_);
  broadcast_coalesced(state_tensors_, src.item<int>(), copts_);
}

}  // namespace ddp::detail
