// Reducer: construction, hooks, bucket layout and the one-time rebuild.
// See Note [Reducer protocol] in reducer.h.
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "reducer/bucket_assignment.h"
#include "reducer/reducer_state.h"

namespace ddp::detail {
namespace {

// Post-hook on a parameter's AccumulateGrad node. Holds the reducer weakly:
// a hook left on a model whose wrapper is gone does nothing.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> reducer, size_t index,
            void (Reducer::*fn)(size_t))
      : reducer_(std::move(reducer)), index_(index), fn_(fn) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto r = reducer_.lock()) ((*r).*fn_)(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
  void (Reducer::*fn_)(size_t);
};

}  // namespace

std::shared_ptr<Reducer> Reducer::create(std::vector<std::string> names,
                                         std::vector<at::Tensor> params,
                                         ProcessGroupPtr group,
                                         std::unique_ptr<BucketComm> comm,
                                         ReducerOptions options) {
  std::shared_ptr<Reducer> r(new Reducer(std::move(names), std::move(params),
                                         std::move(group), std::move(comm),
                                         std::move(options)));
  r->install_hooks();
  return r;
}

Reducer::Reducer(std::vector<std::string> names, std::vector<at::Tensor> params,
                 ProcessGroupPtr group, std::unique_ptr<BucketComm> comm,
                 ReducerOptions options)
    : group_(std::move(group)),
      options_(std::move(options)),
      comm_(std::move(comm)),
      world_size_(group_->size()),
      now_{world_size_, world_size_},
      next_{world_size_, world_size_},
      clock_(std::make_unique<DeviceClock>(params.empty() ? c10::Device(c10::kCPU)
                                                          : params.front().device())) {
  params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params_[i].name = std::move(names[i]);
    params_[i].tensor = std::move(params[i]);
  }
  used_since_sync_.assign(params_.size(), 0);
  if (options_.static_graph) {
    static_ = std::make_unique<StaticGraph>();
    static_->last_fired.assign(params_.size(), 0);
  }
  // Reverse registration order approximates the order gradients become
  // ready (the last layer's first).
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
  iter_ = std::make_unique<Iteration>(params_.size(), buckets_);
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> self = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    // The parameter holds its accumulator only weakly; keeping it here keeps
    // our hook alive for the wrapper's lifetime.
    compat::NodePtr acc = torch::autograd::impl::grad_accumulator(p.tensor);
    if (!acc) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: parameter '{}' has no gradient "
          "accumulator (is it a non-leaf tensor?)",
          p.name));
    }
    if (acc == p.grad_accumulator) continue;
    p.grad_accumulator = std::move(acc);
    p.hook_key = p.grad_accumulator->add_post_hook(
        std::make_unique<ReadyHook>(self, i, &Reducer::autograd_hook));
  }
}

void Reducer::refresh_hooks() {
  std::lock_guard<std::mutex> lock(mu_);
  install_hooks();
}

Reducer::~Reducer() {
  for (Param& p : params_) {
    if (p.grad_accumulator) p.grad_accumulator->del_post_hook(p.hook_key);
  }
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  std::vector<BucketParamInfo> info;
  for (const Param& p : params_) {
    info.push_back({static_cast<int64_t>(p.tensor.numel() * p.tensor.element_size()),
                    p.tensor.scalar_type(), p.tensor.device()});
  }
  auto assignment = compute_bucket_assignment(
      info, order, {options_.first_bucket_cap_bytes, options_.bucket_cap_bytes});
  at::NoGradGuard no_grad;
  std::vector<Bucket> buckets(assignment.size());
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.params = assignment[b];
    const at::Tensor& first = params_[bucket.params.front()].tensor;
    auto opts = first.options().requires_grad(false);
    if (options_.bucket_dtype) opts = opts.dtype(*options_.bucket_dtype);
    for (size_t idx : bucket.params) {
      bucket.offsets.push_back(bucket.grad_numel);
      bucket.grad_numel += params_[idx].tensor.numel();
    }
    const int64_t n = static_cast<int64_t>(bucket.params.size());
    BucketBuffer buffer = comm_->allocate(bucket.grad_numel + n, opts);
    bucket.flat = buffer.tensor;
    bucket.in_shared_memory = buffer.in_shared_memory;
    bucket.grads = bucket.flat.narrow(0, 0, bucket.grad_numel);
    bucket.flags = bucket.flat.narrow(0, bucket.grad_numel, n);
    bucket.produced = at::zeros(
        {n}, at::TensorOptions().dtype(at::kFloat).pinned_memory(opts.device().is_cuda()));
    bucket.scale = at::scalar_tensor(1.0 / now_.divisor, opts);
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      Param& p = params_[bucket.params[s]];
      // detach(): the view shares the bucket's memory but is not an
      // autograd view, so optimizers may detach_() it when it is .grad().
      bucket.views.push_back(bucket.flat.narrow(0, bucket.offsets[s], p.tensor.numel())
                                 .view(p.tensor.sizes())
                                 .detach());
      p.bucket = b;
      p.slot = s;
      // Keep accumulated gradients when the layout changes (rebuild).
      if (options_.gradient_as_bucket_view && p.tensor.grad().defined()) {
        bucket.views.back().copy_(p.tensor.grad());
        p.tensor.mutable_grad() = bucket.views.back();
      }
    }
  }
  buckets_ = std::move(buckets);
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (rebuild_.done || iterations_ != 1) return;
  rebuild_.done = true;
  // Rank 0's first-iteration order, or -1 when it has none; every rank takes
  // part in the broadcast so the collectives stay in step.
  const int64_t n = static_cast<int64_t>(params_.size());
  at::Tensor order = at::full({n + 1}, -1, at::kLong);
  if (group_->rank() == 0 && rebuild_.order.size() == params_.size()) {
    auto* p = order.data_ptr<int64_t>();
    p[0] = 1;
    for (int64_t i = 0; i < n; ++i) p[i + 1] = static_cast<int64_t>(rebuild_.order[i]);
  }
  CollectiveOptions copts{group_, options_.timeout};
  broadcast(order, 0, copts);
  const auto* p = order.data_ptr<int64_t>();
  if (p[0] != 1) return;
  std::vector<size_t> rebuilt(p + 1, p + 1 + n);
  build_buckets(rebuilt);  // the next prepare_for_backward() sizes the iteration
  rebuild_.rebuilt = true;
}

void Reducer::register_comm_hook(std::unique_ptr<BucketComm> comm) {
  std::lock_guard<std::mutex> lock(mu_);
  if (custom_hook_) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel::register_comm_hook: a comm hook ('{}') is already "
        "registered; it can be registered only once (as in PyTorch). Construct a new "
        "wrapper to change it",
        comm_->name()));
  }
  if (iterations_ > 0 || mode_ != Mode::kNone) {
    throw InvalidArgument(
        "DistributedDataParallel::register_comm_hook: call it before the first forward "
        "(a forward has already run with the built-in all_reduce; construct a new wrapper "
        "and register the hook before using it)");
  }
  comm_ = std::move(comm);
  custom_hook_ = true;
  std::vector<size_t> order;
  for (const Bucket& b : buckets_) order.insert(order.end(), b.params.begin(), b.params.end());
  build_buckets(order);  // in the new comm's memory
}

Reducer::Stats Reducer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.comm_hook = comm_->name();
  s.world_size = world_size_;
  s.parameters = static_cast<int64_t>(params_.size());
  for (const Bucket& b : buckets_) {
    int64_t bytes = b.grad_numel * b.flat.element_size();
    s.bucket_bytes.push_back(bytes);
    s.bucket_params.push_back(static_cast<int64_t>(b.params.size()));
    s.gradient_bytes += bytes;
    s.shared_memory_buckets += b.in_shared_memory ? 1 : 0;
  }
  s.iterations = iterations_;
  s.buckets_rebuilt = rebuild_.rebuilt;
  s.unused_parameters_last = unused_last_;
  clock_->settle();
  const DeviceClock::Sums& t = clock_->sums();
  double n = static_cast<double>(std::max<int64_t>(t.samples, 1));
  s.backward_compute_s = t.backward_compute / n;
  s.backward_comm_s = t.backward_comm / n;
  s.exposed_comm_s = t.exposed_comm / n;
  return s;
}

}  // namespace ddp::detail
