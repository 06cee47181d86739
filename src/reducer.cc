// Reducer: the per-iteration protocol of Note [Reducer protocol] (reducer.h).
#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <iterator>
#include <unordered_set>

#include "ddp/error.h"
#include "ddp/logging.h"
#include "work.h"
#include "reducer_state.h"

namespace ddp::detail {

void Reducer::set_iteration_users(int users, int divisor) {
  std::lock_guard<std::mutex> lock(mu_);
  next_users_ = users;
  next_divisor_ = std::max(divisor, 1);
}

void Reducer::reset_iteration() {
  users_ = next_users_;
  if (next_divisor_ != divisor_) {
    divisor_ = next_divisor_;
    for (Bucket& b : buckets_) b.scale.fill_(1.0 / divisor_);
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.produced.zero_();
  }
  for (Param& p : params_) p.saved_grad = at::Tensor();
  std::fill(hooks_seen_.begin(), hooks_seen_.end(), 0);
  static_changes_.clear();
  next_launch_ = 0;
  first_hook_seen_ = false;
  finalize_queued_ = false;
  unreachable_.clear();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs,
                                   bool outputs_known) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || (expect_hooks_ && first_hook_seen_)) {
    // Hooks fired but the callback never ran: backward() threw midway; or
    // waiting for the buckets failed (a comm hook's value or continuation,
    // a collective), leaving later buckets unfinished.
    throw InvalidArgument(
        "DistributedDataParallel: the previous backward() did not finish (it "
        "threw part-way), so gradient buckets were left half-reduced and the "
        "ranks are out of step. Destroy the process group and restart (or "
        "resume from a checkpoint)");
  }
  // A synchronised forward still waiting for its backward: this one's
  // backward may go through both (Note [Reducer protocol]).
  const bool pending = expect_hooks_;
  std::vector<size_t> earlier_unreachable = std::move(unreachable_);
  reset_iteration();
  if (options_.static_graph) {
    unreachable_ = static_unused();  // none while learning
  } else if (options_.find_unused_parameters) {
    if (!outputs_known) {
      throw InvalidArgument(
          "DistributedDataParallel(find_unused_parameters=true) cannot list "
          "the tensors of this forward's output type: define "
          "`void collect_tensors(const YourOutput&, std::vector<at::Tensor>&)` "
          "in your output type's namespace");
    }
    unreachable_ = unreachable_from(outputs);
    if (pending) {
      std::vector<size_t> both;
      std::set_intersection(unreachable_.begin(), unreachable_.end(),
                            earlier_unreachable.begin(), earlier_unreachable.end(),
                            std::back_inserter(both));
      unreachable_ = std::move(both);
    }
  }
  hook_outputs(outputs_known ? outputs : std::vector<at::Tensor>{});
  mode_ = Mode::kSync;
  expect_hooks_ = true;
  finalized_ = false;
  timing_->clock.begin_sample();
}

void Reducer::forward_without_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!(expect_hooks_ && first_hook_seen_)) expect_hooks_ = false;
  finalized_ = false;
  mode_ = Mode::kLocal;
}

void Reducer::set_sync_requested(bool requested) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_requested_ = requested;
}

// A hook on each output of a synchronised forward counts the gradients that
// reach it, which tells a second backward through this forward from a
// backward through a graph the wrapper never saw. Leaves are skipped: a
// hook on a leaf (a parameter returned as is) would stay on it for good.
void Reducer::hook_outputs(const std::vector<at::Tensor>& outputs) {
  outputs_hooked_ = false;
  std::weak_ptr<Reducer> self = weak_from_this();
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad() || !t.grad_fn()) continue;
    at::Tensor out = t;
    out.register_hook([self](at::Tensor) {
      if (auto r = self.lock()) r->output_grad_seen();
    });
    outputs_hooked_ = true;
  }
}

void Reducer::output_grad_seen() {
  std::lock_guard<std::mutex> lock(mu_);
  ++output_grads_;
  // static_graph: an output's gradient is computed in the outer backward,
  // so the callback lands on it even when the first parameter gradient
  // arrives inside a re-entrant backward (a checkpointed last module), whose
  // own end would otherwise finalize too early (PyTorch queues it from
  // _DDPSink for static_graph). Not otherwise: an autograd::grad() through
  // the outputs (a gradient penalty) would then finalize with no gradients.
  if (expect_hooks_ && options_.static_graph) queue_finalize();
}

void Reducer::queue_finalize() {
  if (finalize_queued_) return;
  finalize_queued_ = true;
  std::weak_ptr<Reducer> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto r = self.lock()) r->finalize_backward();
  });
}

void Reducer::unexpected_gradient(size_t index) {
  const std::string& name = params_[index].name;
  if (mode_ == Mode::kLocal) {  // a no_sync micro-step: accumulate only
    used_since_sync_[index] = 1;
    if (sync_requested_ && group_->impl().debug) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel (debug mode): parameter '{}' got a gradient "
          "from a forward that ran inside no_sync(), after the no_sync guard "
          "ended. Whether gradients are synchronised is decided at forward (as "
          "in PyTorch), so this backward only accumulates locally and an "
          "optimizer step now would apply gradients that differ across ranks. "
          "Run the forward of the synchronising micro-step outside the guard, "
          "or keep the guard alive until after its backward",
          name));
    }
    return;
  }
  if (finalized_ && outputs_hooked_ && output_grads_ > output_grads_at_finalize_) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: backward() ran twice for one forward "
        "(parameter '{}' got a second gradient through the same forward's "
        "outputs). Run forward again before each backward, or accumulate "
        "inside no_sync()",
        name));
  }
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: parameter '{}' got a gradient from a backward "
      "whose graph {}did not come from the wrapper's forward (for example "
      "model.module()->forward(x)), so no gradient would be averaged and the "
      "ranks would drift apart. Build the graph you backpropagate through by "
      "calling the wrapper, model(x); for a backward that should stay local, "
      "run that forward inside model.no_sync()",
      name,
      finalized_ && !outputs_hooked_
          ? "(or a second backward of one forward: the outputs could not be "
            "listed to tell) "
          : ""));
}

std::vector<size_t> Reducer::unreachable_from(
    const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  auto visit = [&](torch::autograd::Node* n) {
    if (n && seen.insert(n).second) stack.push_back(n);
  };
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.grad_fn()) {
      visit(t.grad_fn().get());
    } else {
      visit(torch::autograd::impl::try_get_grad_accumulator(t).get());
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    for (const auto& edge : n->next_edges()) visit(edge.function.get());
  }
  std::vector<size_t> unreachable;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen.count(params_[i].grad_accumulator.get())) unreachable.push_back(i);
  }
  return unreachable;
}

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!expect_hooks_) {
    unexpected_gradient(index);
    return;
  }
  if (!first_hook_seen_) {
    first_hook_seen_ = true;
    queue_finalize();  // the outputs could not be hooked
    for (size_t i : unreachable_) mark_ready(i, /*produced=*/false);
  }
  if (options_.static_graph && !static_graph_hook(index)) return;
  if (ready_[index]) {
    const bool searched = std::binary_search(unreachable_.begin(), unreachable_.end(), index);
    if (searched) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' got a gradient although "
          "find_unused_parameters' graph search could not reach it from the "
          "forward's outputs. Return every tensor computed from it from "
          "forward (or list it in collect_tensors for your output type)",
          params_[index].name));
    }
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: parameter '{}' got a second gradient in one backward "
        "(autograd accumulated into it twice: a re-entrant backward, such as activation "
        "checkpointing of a module used more than once), after its first was already being "
        "reduced. Construct DistributedDataParallel with static_graph = true, which reduces "
        "it once after its last use (the graph must then be the same every iteration)",
        params_[index].name));
  }
  mark_ready(index, /*produced=*/true);
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index, bool produced) {
  // Accumulated in no_sync micro-steps: this rank's contribution.
  produced = produced || used_since_sync_[index];
  Param& p = params_[index];
  Bucket& b = buckets_[p.bucket];
  at::Tensor& view = b.views[p.slot];
  const at::Tensor& grad = p.tensor.grad();
  at::NoGradGuard no_grad;
  if (local_only()) {
    // Alone in the group: the average is the gradient itself; no copy.
  } else if (grad.defined()) {
    if (grad.is_sparse()) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' has a sparse gradient; "
          "sparse gradients are not supported (use a dense embedding)",
          p.name));
    }
    if (options_.gradient_as_bucket_view) {
      if (!produced) p.saved_grad = grad.clone();
      if (!grad.is_alias_of(view)) {
        view.copy_(grad);
        p.tensor.mutable_grad() = view;
      }
    } else if (comm_->prescaled()) {
      // One pass: copy and pre-scale (PyTorch's mul_out with 1/world_size).
      at::mul_out(view, grad, b.scale);
    } else {
      view.copy_(grad);  // a comm hook divides (as in PyTorch)
    }
  } else {
    view.zero_();
  }
  b.produced_data()[p.slot] = produced ? 1.0f : 0.0f;
  ready_[index] = 1;
  --b.pending;
  if (!rebuild_done_ && iterations_ == 0) ready_order_.push_back(index);
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(next_launch_++);
  }
}

void Reducer::launch(size_t k) {
  Bucket& b = buckets_[k];
  at::NoGradGuard no_grad;
  if (local_only()) return;  // world size 1: nothing to launch, no communication
  DeviceClock& clock = timing_->clock;
  if (!clock.marked(DeviceClock::kFirstLaunch)) clock.mark(DeviceClock::kFirstLaunch);
  if (options_.gradient_as_bucket_view && comm_->prescaled()) b.grads.mul_(b.scale);
  b.flags.copy_(b.produced, /*non_blocking=*/true);  // Note [CUDA buckets]
  start_comm(k);
}

BucketIo Reducer::bucket_io(size_t k) const {
  const Bucket& b = buckets_[k];
  BucketIo io;
  io.index = k;
  io.count = buckets_.size();
  io.flat = b.flat;
  io.grads = b.grads;
  io.flags = b.flags;
  for (size_t i : b.params) io.params.push_back(params_[i].tensor);
  io.offsets = b.offsets;
  io.iteration = iterations_;
  io.divisor = divisor_;
  return io;
}

std::vector<BucketIo> Reducer::bucket_io() const {
  std::vector<BucketIo> all;
  for (size_t k = 0; k < buckets_.size(); ++k) all.push_back(bucket_io(k));
  return all;
}

void Reducer::start_comm(size_t k) { comm_->launch(bucket_io(k)); }

void Reducer::shadow_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    buckets_[k].flat.zero_();
    start_comm(k);
  }
  // The reduced gradients land in this rank's .grad() too (PyTorch's
  // joined rank discards them): a JoinHook stepping an optimizer (ZeRO's
  // shard) needs them, exactly as the training ranks see them. A parameter
  // no rank produced gets what the training ranks' zero_grad() left (no
  // gradient; zeros on libtorch 1.13), not this rank's stale one.
  std::vector<float> counts(params_.size(), 0.0f);
  wait_and_write_back(counts, /*shadow=*/true);
  ++iterations_;
}

void Reducer::fence_shared_buckets() {
  if (std::none_of(buckets_.begin(), buckets_.end(),
                   [](const Bucket& b) { return b.in_shared_memory; })) {
    return;
  }
  ProcessGroupImpl& g = group_->impl();
  try {
    g.shm->fence(options_.timeout.value_or(g.timeout));
  } catch (...) {
    rethrow_as_comm_error("DistributedDataParallel: waiting for the peers to finish reading "
                          "the shared gradient buckets");
  }
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!expect_hooks_) return;
  timing_->clock.mark(DeviceClock::kComputeEnd);
  expect_hooks_ = false;
  finalized_ = true;
  const bool learning = static_learning();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) mark_ready(i, /*produced=*/learning && hooks_seen_[i] > 0);
  }
  if (learning) learn_static_graph();
  launch_ready_buckets();
  std::vector<float> counts(params_.size(), 0.0f);
  try {
    wait_and_write_back(counts);
  } catch (...) {
    broken_ = true;
    throw;
  }
  // The first iteration includes set-up; at world size 1 nothing is
  // launched, so the communication times stay 0.
  timing_->clock.end_sample(/*sampled=*/iterations_ > 0);
  ++iterations_;
  output_grads_at_finalize_ = output_grads_;
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  check_static_graph(learning);
  check_unused(counts);
}

void Reducer::wait_and_write_back(std::vector<float>& counts, bool shadow) {
  at::NoGradGuard no_grad;
  if (local_only()) {  // nothing was copied or sent: .grad() is the result
    for (const Bucket& b : buckets_) {
      for (size_t s = 0; s < b.params.size(); ++s) counts[b.params[s]] = b.produced_data()[s];
    }
    return;
  }
  comm_->wait(bucket_io());
  fence_shared_buckets();
  for (Bucket& b : buckets_) {
    at::Tensor flags = b.flags.to(at::kCPU, at::kFloat).contiguous();
    const float* f = flags.data_ptr<float>();
    for (size_t s = 0; s < b.params.size(); ++s) {
      Param& p = params_[b.params[s]];
      counts[b.params[s]] = f[s];
      at::Tensor& grad = p.tensor.mutable_grad();
      if (f[s] == 0.0f) {  // no rank produced it: leave .grad() as it was
        if (shadow) {  // as the training ranks' after their zero_grad()
          compat::clear_grad_as_zero_grad(grad);
        } else if (p.saved_grad.defined()) {
          grad = p.saved_grad;
        }
        continue;
      }
      if (options_.gradient_as_bucket_view) {
        grad = b.views[s];
      } else if (grad.defined()) {
        grad.copy_(b.views[s]);
      } else {
        grad = b.views[s].clone();
      }
    }
  }
}

bool Reducer::produced_here(size_t index) const {
  const Param& p = params_[index];
  return buckets_[p.bucket].produced_data()[p.slot] > 0.0f;
}

void Reducer::check_unused(const std::vector<float>& counts) {
  std::vector<std::string> problems;
  int64_t unused = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    int used_by = static_cast<int>(counts[i] + 0.5f);
    if (used_by == users_) continue;
    ++unused;
    if (options_.find_unused_parameters || options_.static_graph) continue;
    std::string where =
        used_by == 0 ? fmt::format("unused on all {} ranks", users_)
                     : fmt::format("{} on this rank; used on {} of {} ranks",
                                   produced_here(i) ? "used" : "unused", used_by, users_);
    problems.push_back(fmt::format("  {} ({})", params_[i].name, where));
  }
  unused_last_ = unused;
  ever_unused_ = ever_unused_ || unused > 0;
  if (!problems.empty()) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: {} parameter(s) received no gradient in "
        "backward pass {} (their gradients were reduced as zeros so that no "
        "rank hangs):\n{}\nEvery parameter must take part in computing the "
        "loss on every rank. Either (1) construct DistributedDataParallel with "
        "find_unused_parameters = true, or (2) make every output of forward "
        "take part in the loss (or freeze the parameter with "
        "requires_grad_(false) before wrapping the model)",
        problems.size(), iterations_ - 1, fmt::join(problems, "\n")));
  }
  if (options_.find_unused_parameters && !options_.static_graph && !ever_unused_ &&
      !warned_never_unused_ &&
      iterations_ == 1 && group_->rank() == 0) {
    warned_never_unused_ = true;
    ddp::log(LogLevel::kWarning,
        "ddp: find_unused_parameters=true but no parameter was unused in the first "
        "iteration; it costs an autograd graph traversal per iteration. Construct "
        "DistributedDataParallel with find_unused_parameters=false if your model always "
        "uses every parameter");
  }
}

}  // namespace ddp::detail
