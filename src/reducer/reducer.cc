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
#include "reducer/reducer_state.h"

namespace ddp::detail {

void Reducer::set_iteration_users(int users, int divisor) {
  std::lock_guard<std::mutex> lock(mu_);
  next_ = {users, std::max(divisor, 1)};
}

bool Reducer::local_only() const {
  return world_size_ == 1 && now_.divisor == 1 && comm_->prescaled() && !options_.reduce_alone;
}

void Reducer::reset_iteration() {
  if (next_.divisor != now_.divisor) {
    for (Bucket& b : buckets_) b.scale.fill_(1.0 / next_.divisor);
  }
  now_ = next_;
  *iter_ = Iteration(params_.size(), buckets_);
  for (Bucket& b : buckets_) b.produced.zero_();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs,
                                   bool outputs_known) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::kBroken || phase_ == Phase::kReducing) {
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
  const bool pending = phase_ == Phase::kPrepared;
  std::vector<size_t> earlier_unreachable = std::move(iter_->unreachable);
  reset_iteration();
  std::vector<size_t>& unreachable = iter_->unreachable;
  if (options_.static_graph) {
    unreachable = static_unused();  // none while learning
  } else if (options_.find_unused_parameters) {
    if (!outputs_known) {
      throw InvalidArgument(
          "DistributedDataParallel(find_unused_parameters=true) cannot list "
          "the tensors of this forward's output type: define "
          "`void collect_tensors(const YourOutput&, std::vector<at::Tensor>&)` "
          "in your output type's namespace");
    }
    unreachable = unreachable_from(outputs);
    if (pending) {
      std::vector<size_t> both;
      std::set_intersection(unreachable.begin(), unreachable.end(),
                            earlier_unreachable.begin(), earlier_unreachable.end(),
                            std::back_inserter(both));
      unreachable = std::move(both);
    }
  }
  hook_outputs(outputs_known ? outputs : std::vector<at::Tensor>{});
  mode_ = Mode::kSync;
  phase_ = Phase::kPrepared;
  clock_->begin_sample();
}

void Reducer::forward_without_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  // A synchronised forward whose backward has not started is dropped (its
  // graph may still be backpropagated: as local accumulation); one whose
  // backward runs finishes it; a broken reducer stays broken.
  if (phase_ == Phase::kPrepared || phase_ == Phase::kFinished) phase_ = Phase::kIdle;
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
  if (expecting() && options_.static_graph) queue_finalize();
}

void Reducer::queue_finalize() {
  if (iter_->finalize_queued) return;
  iter_->finalize_queued = true;
  std::weak_ptr<Reducer> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto r = self.lock()) r->finalize_backward();
  });
}

void Reducer::queue_local_end() {
  if (!options_.on_backward_end || local_end_queued_) return;
  local_end_queued_ = true;
  std::weak_ptr<Reducer> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    auto r = self.lock();
    if (!r) return;
    std::lock_guard<std::mutex> lock(r->mu_);
    r->local_end_queued_ = false;
    r->options_.on_backward_end();
  });
}

void Reducer::unexpected_gradient(size_t index) {
  const std::string& name = params_[index].name;
  if (mode_ == Mode::kLocal) {  // a no_sync micro-step: accumulate only
    used_since_sync_[index] = 1;
    queue_local_end();
    if (sync_requested_ && options_.debug) {
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
  // Broken counts as finished: its backward got as far as the wait.
  const bool finished = phase_ == Phase::kFinished || phase_ == Phase::kBroken;
  if (finished && outputs_hooked_ && output_grads_ > output_grads_at_finalize_) {
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
      "model.module()->forward(x), or the forward of a second wrapper of the "
      "same module while this one lives: destroy the first before wrapping "
      "the module again), so no gradient would be averaged and the "
      "ranks would drift apart. Build the graph you backpropagate through by "
      "calling the wrapper, model(x); for a backward that should stay local, "
      "run that forward inside model.no_sync()",
      name,
      finished && !outputs_hooked_
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
  if (!expecting()) {
    unexpected_gradient(index);
    return;
  }
  if (phase_ == Phase::kPrepared) {  // the first gradient of this backward
    phase_ = Phase::kReducing;
    queue_finalize();  // the outputs could not be hooked
    for (size_t i : iter_->unreachable) mark_ready(i, /*produced=*/false);
  }
  if (options_.static_graph && !static_graph_hook(index)) return;
  if (iter_->ready[index]) {
    const std::vector<size_t>& unreachable = iter_->unreachable;
    const bool searched = std::binary_search(unreachable.begin(), unreachable.end(), index);
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
      if (!produced) iter_->saved_grads[index] = grad.clone();
      if (!grad.is_alias_of(view)) {
        view.copy_(grad);
        p.tensor.mutable_grad() = view;
      }
    } else if (comm_->prescaled() && grad.scalar_type() == view.scalar_type()) {
      // One pass: copy and pre-scale (PyTorch's mul_out with 1/world_size).
      at::mul_out(view, grad, b.scale);
    } else if (comm_->prescaled()) {
      // Mixed precision: cast into the bucket, then scale in its dtype
      // (mul_out would compute in the gradient's).
      view.copy_(grad);
      view.mul_(b.scale);
    } else {
      view.copy_(grad);  // a comm hook divides (as in PyTorch)
    }
  } else {
    view.zero_();
  }
  b.produced_data()[p.slot] = produced ? 1.0f : 0.0f;
  iter_->ready[index] = 1;
  --iter_->pending[p.bucket];
  if (!rebuild_.done && iterations_ == 0) rebuild_.order.push_back(index);
}

void Reducer::launch_ready_buckets() {
  size_t& next = iter_->next_launch;
  while (next < buckets_.size() && iter_->pending[next] == 0) launch(next++);
}

void Reducer::launch(size_t k) {
  Bucket& b = buckets_[k];
  at::NoGradGuard no_grad;
  if (local_only()) return;  // world size 1: nothing to launch, no communication
  if (!clock_->marked(DeviceClock::kFirstLaunch)) clock_->mark(DeviceClock::kFirstLaunch);
  if (options_.gradient_as_bucket_view && comm_->prescaled()) b.grads.mul_(b.scale);
  b.flags.copy_(b.produced, /*non_blocking=*/true);  // Note [CUDA buckets]
  comm_->launch(bucket_io(k));
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
  io.divisor = now_.divisor;
  return io;
}

std::vector<BucketIo> Reducer::bucket_io() const {
  std::vector<BucketIo> all;
  for (size_t k = 0; k < buckets_.size(); ++k) all.push_back(bucket_io(k));
  return all;
}

void Reducer::shadow_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    buckets_[k].flat.zero_();
    comm_->launch(bucket_io(k));
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
  if (std::any_of(buckets_.begin(), buckets_.end(),
                  [](const Bucket& b) { return b.in_shared_memory; })) {
    comm_->fence();
  }
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!expecting()) return;
  clock_->mark(DeviceClock::kComputeEnd);
  phase_ = Phase::kFinished;
  const bool learning = static_learning();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!iter_->ready[i]) mark_ready(i, /*produced=*/learning && iter_->hooks_seen[i] > 0);
  }
  if (learning) learn_static_graph();
  launch_ready_buckets();
  // Every gradient is in its bucket: the parameters may change dtype now.
  if (options_.on_backward_end) options_.on_backward_end();
  std::vector<float> counts(params_.size(), 0.0f);
  try {
    wait_and_write_back(counts);
  } catch (...) {
    phase_ = Phase::kBroken;
    throw;
  }
  // The first iteration includes set-up; at world size 1 nothing is
  // launched, so the communication times stay 0.
  clock_->end_sample(/*sampled=*/iterations_ > 0);
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
        } else if (iter_->saved_grads[b.params[s]].defined()) {
          grad = iter_->saved_grads[b.params[s]];
        }
        continue;
      }
      if (options_.gradient_as_bucket_view) {
        grad = b.views[s];
      } else if (grad.defined()) {
        grad.copy_(b.views[s]);
      } else {  // in the parameter's dtype, also from a mixed-precision bucket
        grad = b.views[s].to(p.tensor.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
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
    if (used_by == now_.users) continue;
    ++unused;
    if (options_.find_unused_parameters || options_.static_graph) continue;
    std::string where =
        used_by == 0 ? fmt::format("unused on all {} ranks", now_.users)
                     : fmt::format("{} on this rank; used on {} of {} ranks",
                                   produced_here(i) ? "used" : "unused", used_by, now_.users);
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
