// DistributedDataParallel: data-parallel training of any libtorch module.
//
// Wrap the model after init_process_group(); train as usual. Every rank runs
// the same model on its own part of the data; during backward() the
// gradients are averaged across ranks in buckets, each bucket's all_reduce
// starting as soon as its gradients are ready, so communication overlaps the
// rest of the backward pass. When backward() returns, every parameter's
// .grad() is the average over ranks, and an optimizer step keeps the
// replicas identical. W ranks with batch B train exactly like one process
// with batch W*B (up to floating-point rounding).
//
//   ddp::init_process_group();
//   Net net;                                          // any ModuleHolder
//   ddp::DistributedDataParallel<Net> model(net);     // broadcasts rank 0's
//   torch::optim::SGD opt(model.parameters(), 0.1);   //   weights
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     auto loss = torch::nll_loss(model(x), y);
//     loss.backward();                                // averaged gradients
//     opt.step();
//   }
//
// Follows torch.nn.parallel.DistributedDataParallel (PyTorch 1.13/2.x), with
// these differences:
//   - a parameter that got no gradient is reported by name on every rank,
//     always (PyTorch: only with TORCH_DISTRIBUTED_DEBUG), and never hangs;
//   - with find_unused_parameters, parameters reachable from the outputs but
//     not from the loss are handled too (PyTorch raises);
//   - the model is not a submodule of the wrapper: module() is the model and
//     its parameter names carry no "module." prefix;
//   - every backward must come from the wrapper's forward: a graph built
//     with module()->forward() raises instead of silently skipping the
//     reduction, and so does a model changed after wrapping (a parameter
//     added, removed, replaced, reshaped, or its requires_grad flipped);
//   - a parameter that got gradients only in no_sync micro-steps is averaged
//     like the others, with or without find_unused_parameters; two
//     synchronised forwards followed by one backward through both are
//     reduced correctly with find_unused_parameters (PyTorch raises);
//   - sparse gradients (Embedding/EmbeddingBag with sparse=true) are refused
//     at construction (PyTorch reduces them separately).
//
// Threading: one DistributedDataParallel is driven by one thread at a time
// (forward, then backward, which may run hooks on autograd's threads).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"

namespace ddp {

// DDP's native mixed precision (PyTorch 2.x's
// torch.nn.parallel.distributed._MixedPrecision): forward and backward run
// on low-precision copies of the parameters, the optimizer steps the
// full-precision ones. Each dtype unset means "as the parameter/buffer is";
// only floating-point tensors are cast. Per synchronised iteration:
//   - forward: every floating-point parameter (frozen ones too) is cast to
//     param_dtype and swapped in (Python's param.data = low-precision
//     copy), a defined .grad() is cast to param_dtype as well, and
//     floating-point tensor arguments of forward are cast to param_dtype
//     (after device_ids moves them). Outputs come in param_dtype.
//   - backward: gradients are computed and accumulated in param_dtype,
//     copied into buckets of reduce_dtype (default: param_dtype, else the
//     parameters' dtype), summed across ranks and divided by the world size
//     in reduce_dtype, and written into .grad() in the parameters' own dtype
//     after the full-precision parameters are swapped back, at the end of
//     backward(): the optimizer sees float32 parameters and gradients.
//   - buffers (BatchNorm statistics) are cast to buffer_dtype once, at
//     construction, after the initial broadcast, and stay so (as in
//     PyTorch; they are saved so in checkpoints).
// Between a forward and the end of its backward the parameters hold their
// param_dtype values: step the optimizer, save or evaluate after backward().
// A forward without grad mode (evaluation under NoGradGuard) swaps the
// full-precision parameters back before it returns; a no_sync micro-step's
// backward does at its end.
// Where ddp differs from PyTorch 2.13 (whose version is experimental):
//   - it runs on CPU (PyTorch's needs device events: on CPU it raises
//     "cpu backend doesn't support events");
//   - integer buffers (num_batches_tracked) keep their dtype (PyTorch casts
//     every buffer to buffer_dtype, despite its documentation);
//   - gradients are divided before the sum, in reduce_dtype, as ddp's
//     all_reduce always does (PyTorch: after): the same numbers whenever the
//     world size is a power of two (division by 2^k is exact);
//   - a comm hook may be registered on top (PyTorch refuses): it gets the
//     buckets in reduce_dtype, undivided, as any comm hook;
//   - gradient_as_bucket_view with a reduce or param dtype other than the
//     parameters' is refused (a float32 .grad() cannot view a bfloat16
//     bucket).
// With GradScaler: param_dtype float16 needs it (as autocast's float16
// does); bfloat16 does not.
struct MixedPrecision {
  std::optional<c10::ScalarType> param_dtype;
  std::optional<c10::ScalarType> reduce_dtype;
  std::optional<c10::ScalarType> buffer_dtype;
};

struct DistributedDataParallelOptions {
  // The group whose ranks hold the replicas; null: default_group().
  ProcessGroupPtr process_group;
  // Broadcast rank 0's buffers (BatchNorm running statistics) before each
  // forward in training, as PyTorch does: when the previous forward
  // synchronised gradients (not inside no_sync()).
  bool broadcast_buffers = true;
  // Bucket capacity in MiB (2^20 bytes); a single larger parameter gets a
  // bucket of its own. Must be > 0. PyTorch: 25.
  double bucket_cap_mb = 25.0;
  // Capacity of the first bucket in MiB, small so the first all_reduce
  // starts early. PyTorch: 1 (dist._DEFAULT_FIRST_BUCKET_BYTES).
  double first_bucket_cap_mb = 1.0;
  // Walk the autograd graph from the forward outputs to find parameters that
  // will get no gradient, and reduce them as zeros (see the header comment).
  // Costs one graph traversal per iteration.
  bool find_unused_parameters = false;
  // Make each .grad() a view into its bucket: saves one copy per parameter
  // and the gradients' memory. Do not assign .grad() yourself then.
  bool gradient_as_bucket_view = false;
  // PyTorch's static_graph: the graph is the same every iteration. The first
  // synchronised backward learns which parameters get gradients and how many
  // times (reducing everything at its end); after it, no graph is searched
  // (unused parameters are allowed without find_unused_parameters, at no
  // cost per iteration), and a parameter whose gradient is accumulated more
  // than once per backward (a re-entrant backward: activation checkpointing
  // of a module used twice) is reduced once, after its last use. A backward
  // whose graph differs from the first raises InvalidArgument naming the
  // parameter, on the ranks whose graph changed, after that iteration's
  // buckets are reduced (the other ranks then wait for them at the next
  // collective, up to its timeout). Takes precedence over
  // find_unused_parameters.
  bool static_graph = false;
  // (Debug mode, DDP_DEBUG=1 or InitOptions::debug_collectives, also checks
  // Note [no_sync's rule] at NoSyncGuard.)
  // Verify the model across ranks and broadcast rank 0's parameters and
  // buffers at construction. false skips both (PyTorch 2.x: init_sync).
  bool init_sync = true;
  // CUDA module: the one device it lives on ({cuda:local_rank}, i.e.
  // {ddp::local_device()}); empty for a CPU module or to use the
  // parameters' device. With it, forward moves tensor arguments to that
  // device (PyTorch's DDP does). More than one device, or parameters on
  // another device, throws InvalidArgument (single-device modules only, as
  // in PyTorch).
  std::vector<c10::Device> device_ids;
  // Bound on every collective the wrapper issues; unset: the group's.
  std::optional<std::chrono::milliseconds> timeout;
  // DDP's mixed precision (see MixedPrecision); unset: everything in the
  // parameters' own dtype. A dtype that is not floating point throws
  // InvalidArgument naming the field.
  std::optional<MixedPrecision> mixed_precision;
};

// Runtime statistics, like PyTorch's DDP logging data. Times in seconds,
// averaged over the synchronised iterations since construction (the first
// iteration excluded once there are more, as it includes set-up).
struct DdpStats {
  int64_t iterations = 0;               // synchronised backward passes
  int world_size = 1;
  std::vector<int64_t> bucket_bytes;    // per bucket, gradients only
  std::vector<int64_t> bucket_params;   // number of parameters per bucket
  int64_t parameters = 0;               // reduced (requires_grad) parameters
  int64_t gradient_bytes = 0;           // bytes all-reduced per iteration
  bool buckets_rebuilt = false;         // rebuilt in gradient-ready order
  int64_t shared_memory_buckets = 0;    // buckets living in the group's shared
                                        // memory (reduced in place, no copy)
  int64_t unused_parameters_last = 0;   // unused in the last iteration
  double forward_s = 0;                 // forward wall time on the host (CUDA:
                                        // the time to queue its kernels)
  // Backward times: host clocks for a CPU module, CUDA events on the
  // streams for a CUDA one (what the GPU did, not what the host queued).
  double backward_compute_s = 0;        // end of forward -> last grad ready
  double backward_comm_s = 0;           // first bucket launch -> all done
                                        // (0 at world size 1: nothing is sent)
  double exposed_comm_s = 0;            // waiting for buckets after the last
                                        // gradient (communication not hidden)
  double buffer_broadcast_s = 0;        // broadcast_buffers per forward
  std::string comm_hook;                // how buckets are communicated: the
                                        // built-in all_reduce or the name of
                                        // the registered comm hook
};

// A one-line summary of DdpStats for logs.
std::string to_string(const DdpStats& stats);

// Customization point for find_unused_parameters: the tensors of a forward
// output. Provided for at::Tensor, std::vector, std::tuple, std::pair,
// std::map/unordered_map values and std::optional. For your own output
// struct define, in its namespace,
//   void collect_tensors(const MyOutput& out, std::vector<at::Tensor>& into);
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& into) {
  into.push_back(t);
}
template <typename T>
void collect_tensors(const std::vector<T>& v, std::vector<at::Tensor>& into);
template <typename... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<at::Tensor>& into);
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& into);
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& m, std::vector<at::Tensor>& into);
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& m, std::vector<at::Tensor>& into);
template <typename T>
void collect_tensors(const std::optional<T>& o, std::vector<at::Tensor>& into);

namespace detail {

template <typename T, typename = void>
struct has_collect_tensors : std::false_type {};
template <typename T>
struct has_collect_tensors<T, std::void_t<decltype(collect_tensors(
                                  std::declval<const T&>(),
                                  std::declval<std::vector<at::Tensor>&>()))>>
    : std::true_type {};

// Collects when possible; returns false for output types it cannot see into.
template <typename T>
bool try_collect_tensors(const T& value, std::vector<at::Tensor>& into) {
  if constexpr (has_collect_tensors<T>::value) {
    collect_tensors(value, into);
    return true;
  } else {
    return std::is_arithmetic_v<T>;
  }
}

class DdpCore;

// The non-template machinery behind DistributedDataParallel (src/).
std::shared_ptr<DdpCore> make_ddp_core(std::shared_ptr<torch::nn::Module> module,
                                       const DistributedDataParallelOptions& options);
void pre_forward(DdpCore& core);
// A tensor argument of forward (index: its position, from 0) on the
// module's device: moved there when device_ids names it (PyTorch's DDP moves
// inputs to device_ids[0]); without device_ids, a floating-point tensor on
// another device is InvalidArgument naming the argument and both devices.
// With MixedPrecision::param_dtype, a floating-point one is cast to it.
at::Tensor input_to_device(const DdpCore& core, const at::Tensor& input, size_t index);
// outputs_known: false when the output type's tensors could not be listed.
void post_forward(DdpCore& core, const std::vector<at::Tensor>& outputs,
                  bool outputs_known);
bool wants_outputs(const DdpCore& core);
void set_grad_sync(DdpCore& core, bool enabled);
bool grad_sync(const DdpCore& core);
void sync_buffers(DdpCore& core);
DdpStats stats(const DdpCore& core);
void register_comm_hook(DdpCore& core, CommHook hook, std::string name);
// Parameters deduplicated by identity (a tied tensor once, under its first
// name), as Python's Module.parameters() / named_parameters().
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse);
torch::OrderedDict<std::string, at::Tensor> unique_named_parameters(
    const torch::nn::Module& module, bool recurse);

// forward's arguments on their way to the module: a tensor is held by
// value, through input_to_device() (moved to the module's device with
// device_ids, else checked); anything else by reference, unchanged.
template <typename Arg>
using PreparedInput =
    std::conditional_t<std::is_same_v<std::decay_t<Arg>, at::Tensor>, at::Tensor, Arg&&>;

template <typename Arg>
PreparedInput<Arg> prepare_input(const DdpCore& core, size_t index, Arg&& arg) {
  if constexpr (std::is_same_v<std::decay_t<Arg>, at::Tensor>) {
    return input_to_device(core, arg, index);
  } else {
    return std::forward<Arg>(arg);
  }
}

// A held argument as the caller passed it: an lvalue stays an lvalue (a
// forward taking at::Tensor& binds to the held tensor), an rvalue an rvalue.
template <typename Arg, typename Held>
decltype(auto) pass_input(Held& held) {
  if constexpr (std::is_same_v<std::decay_t<Arg>, at::Tensor> && std::is_lvalue_reference_v<Arg>) {
    return static_cast<at::Tensor&>(held);
  } else if constexpr (std::is_same_v<std::decay_t<Arg>, at::Tensor>) {
    return static_cast<at::Tensor&&>(held);
  } else {
    return static_cast<Arg&&>(held);
  }
}

template <typename M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& m) {
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, M>) {
    return m.ptr();  // a ModuleHolder
  } else {
    return m;  // a std::shared_ptr<SomeModule>
  }
}

}  // namespace detail

template <typename T>
void collect_tensors(const std::vector<T>& v, std::vector<at::Tensor>& into) {
  for (const auto& x : v) detail::try_collect_tensors(x, into);
}
template <typename... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<at::Tensor>& into) {
  std::apply([&](const auto&... x) { (detail::try_collect_tensors(x, into), ...); }, t);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& into) {
  detail::try_collect_tensors(p.first, into);
  detail::try_collect_tensors(p.second, into);
}
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& m, std::vector<at::Tensor>& into) {
  for (const auto& kv : m) detail::try_collect_tensors(kv.second, into);
}
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& m, std::vector<at::Tensor>& into) {
  for (const auto& kv : m) detail::try_collect_tensors(kv.second, into);
}
template <typename T>
void collect_tensors(const std::optional<T>& o, std::vector<at::Tensor>& into) {
  if (o) detail::try_collect_tensors(*o, into);
}

// Scope guard returned by DistributedDataParallel::no_sync(): gradient
// accumulation without communication. K micro-batches of B with no_sync on
// the first K-1 equal one step of K*B.
//
// Note [no_sync's rule]
// The rule (PyTorch's): whether a micro-step synchronises is decided by its
// FORWARD. A forward run while a guard lives builds a graph whose backward
// only accumulates into .grad(), wherever that backward runs; a forward run
// with no guard alive builds one whose backward averages everything
// accumulated since the last synchronised backward. So
//   for (int k = 0; k < K - 1; ++k) {
//     auto guard = model.no_sync();
//     loss_fn(model(x[k]), y[k]).backward();   // local
//   }
//   loss_fn(model(x[K - 1]), y[K - 1]).backward();  // averages all K
//   opt.step();
// The classic mistake is the forward of the last micro-step inside the
// guard and its backward after it: nothing is averaged and opt.step()
// applies gradients that differ across ranks. Debug mode (DDP_DEBUG=1)
// raises InvalidArgument at that backward, naming the rule.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(std::shared_ptr<detail::DdpCore> core);
  ~NoSyncGuard();
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  std::shared_ptr<detail::DdpCore> core_;
  bool previous_ = true;
};

// ModuleType: a ModuleHolder (e.g. `Net` from TORCH_MODULE(Net)) or a
// std::shared_ptr to a module class; it must have a forward().
//
// Construction is a collective: every rank of the group must construct its
// wrapper at the same point, with the same model (same parameter names,
// shapes and dtypes, in the same registration order). It throws
//   MismatchError    on every rank when the models differ, naming the first
//                    differing parameter and both ranks' shapes;
//   InvalidArgument  for bad options (bucket sizes <= 0, several
//                    device_ids, parameters on several devices);
//   TimeoutError / CommError as the collectives (collectives.h).
// construction also throws InvalidArgument for a parameter with sparse
// gradients (Embedding/EmbeddingBag with sparse=true), naming it.
// forward() throws InvalidArgument when the model changed after wrapping,
// naming the parameter (wrap the changed model again).
// backward() throws InvalidArgument on every rank, naming each parameter,
// when parameters got no gradient and find_unused_parameters is false; and,
// naming the parameter, when backward() runs twice for one forward or on a
// graph that did not come from the wrapper's forward (module()->forward()).
template <typename ModuleType>
class DistributedDataParallel {
 public:
  using Options = DistributedDataParallelOptions;

  explicit DistributedDataParallel(ModuleType module, Options options = {})
      : module_(std::move(module)),
        core_(detail::make_ddp_core(detail::module_ptr(module_), options)) {}

  // Runs module()->forward(args...) with ddp's bookkeeping around it:
  // buffer broadcast before, unused-parameter search after. Same arguments
  // and return type as the module's forward. Tensor arguments go to the
  // module's device when device_ids is set (as in PyTorch); without it, a
  // floating-point tensor argument on another device than the module's
  // throws InvalidArgument naming the argument (1-based) and both devices.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    return forward_held(std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The wrapped model (shared with the caller, not copied).
  ModuleType& module() { return module_; }
  const ModuleType& module() const { return module_; }

  // The model's parameters for an optimizer, each tensor once: a tied
  // weight registered under two names appears under its first name only, as
  // in Python (libtorch's Module::parameters() lists it twice, and an
  // optimizer would then step it twice).
  std::vector<at::Tensor> parameters(bool recurse = true) const {
    return detail::unique_parameters(*detail::module_ptr(module_), recurse);
  }
  torch::OrderedDict<std::string, at::Tensor> named_parameters(bool recurse = true) const {
    return detail::unique_named_parameters(*detail::module_ptr(module_), recurse);
  }
  torch::OrderedDict<std::string, at::Tensor> named_buffers(bool recurse = true) const {
    return detail::module_ptr(module_)->named_buffers(recurse);
  }
  // Python's model.zero_grad(): gradients set to undefined (set_to_none,
  // PyTorch 2.x's default) or zeroed in place.
  void zero_grad(bool set_to_none = true) {
    detail::module_ptr(module_)->zero_grad(set_to_none);
  }
  // Collective: broadcasts rank 0's buffers (BatchNorm running statistics)
  // to every rank now, e.g. before evaluating or saving on one rank (the
  // wrapper otherwise syncs them at the next training forward). Under
  // ddp::join, the highest rank still training is the source. No-op without
  // buffers or at world size 1. Errors as the collectives.
  void sync_buffers() { detail::sync_buffers(*core_); }
  void train(bool on = true) { detail::module_ptr(module_)->train(on); }
  void eval() { train(false); }
  bool is_training() const { return detail::module_ptr(module_)->is_training(); }

  // Gradient accumulation without communication; see NoSyncGuard.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(core_); }

  DdpStats stats() const { return detail::stats(*core_); }

  // PyTorch's register_comm_hook: `hook` replaces the built-in all_reduce
  // of each gradient bucket (comm_hooks.h: when it runs, what it gets, what
  // it must return; the built-in hooks). Call it once, before the first
  // forward; InvalidArgument otherwise (or for an empty hook). Every rank
  // must register the same hook (ddp cannot check it: different hooks
  // issue mismatched collectives). `name` appears in stats() and errors.
  //   model.register_comm_hook(ddp::fp16_compress_hook, "fp16_compress");
  void register_comm_hook(CommHook hook, std::string name = "custom") {
    detail::register_comm_hook(*core_, std::move(hook), std::move(name));
  }
  // With PyTorch's separate state: hook(*state, bucket) is called; the
  // wrapper shares ownership of `state`.
  template <typename State, typename Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook, std::string name = "custom") {
    register_comm_hook(
        [state = std::move(state), hook = std::move(hook)](GradBucket& b) {
          return hook(*state, b);
        },
        std::move(name));
  }

  // For ddp's own extensions (join, comm hooks).
  detail::DdpCore& core() { return *core_; }

 private:
  // The inputs are prepared first: one on the wrong device throws before
  // any bookkeeping or collective of this forward.
  template <size_t... I, typename... Args>
  decltype(auto) forward_held(std::index_sequence<I...>, Args&&... args) {
    std::tuple<detail::PreparedInput<Args>...> held(
        detail::prepare_input(*core_, I, std::forward<Args>(args))...);
    (void)held;  // (a forward without arguments)
    detail::pre_forward(*core_);
    auto out = module_->forward(detail::pass_input<Args>(std::get<I>(held))...);
    std::vector<at::Tensor> tensors;
    bool known = true;
    if (detail::wants_outputs(*core_)) {
      known = detail::try_collect_tensors(out, tensors);
    }
    detail::post_forward(*core_, tensors, known);
    return out;
  }

  ModuleType module_;
  std::shared_ptr<detail::DdpCore> core_;
};

}  // namespace ddp
