// fully_shard: fully sharded data parallelism (PyTorch FSDP2's
// torch.distributed.fsdp.fully_shard) for libtorch modules.
//
// Each rank keeps only its shard of every parameter, of its gradient and so
// of the optimizer state: a unit's parameters are all-gathered just before
// its forward and freed after it, gathered again for its backward, and its
// gradients are reduce-scattered (averaged) into the shards as soon as the
// unit's backward is done, while the backward of the units before it runs.
// An ordinary torch::optim optimizer steps the shards.
//
//   struct BlockImpl : torch::nn::Module { ... forward(at::Tensor) ... };
//   struct NetImpl : torch::nn::Module {
//     NetImpl() {
//       for (int i = 0; i < 4; ++i)   // a unit: FullyShard<BlockImpl>
//         blocks.push_back(register_module("block" + std::to_string(i),
//                                          ddp::FullyShard<BlockImpl>(...)));
//       head = register_module("head", torch::nn::Linear(64, 10));
//     }
//     ...
//   };
//   ddp::FullyShard<NetImpl> net;                    // the root unit
//   for (auto& b : net->blocks) ddp::fully_shard(b); // inner units first,
//   ddp::fully_shard(net);                           // then the root
//   torch::optim::AdamW opt(net->parameters(), 1e-3);  // the shards
//
// Note [Units are wrapper types]: libtorch modules have no forward hooks and
// no common virtual forward, so nothing can run "before a submodule's
// forward" unless the call goes through a type of ours. FullyShard<Impl> is
// that type: FullyShardImpl<Impl> derives from Impl (same parameters, same
// names, same constructors, same members), and its forward gathers, calls
// Impl::forward and reshards. A model shards a submodule by declaring it
// FullyShard<BlockImpl> instead of Block; until fully_shard() is called the
// unit is exactly the plain module (so the same type builds the unsharded
// reference). FSDP2 does the same in Python by swapping the module's class.
//
// Layout (FSDP2's, checked against PyTorch's): every parameter is cut on dim
// 0 as torch.chunk(param, world_size, dim=0) cuts it: chunk = ceil(rows /
// world_size) rows, rank r owns rows [r*chunk, min((r+1)*chunk, rows)),
// possibly none (a [0, ...] shard). A 0-dim parameter counts as one row.
// Parameters of one unit are gathered and reduced in one collective each
// way: the unit's shards padded to `chunk` rows, back to back.
//
// After fully_shard(unit), unit->parameters() (and named_parameters(),
// under the names the plain module has) are the shards: leaf tensors of the
// shard's shape, whose .grad() after backward is the shard of the gradient
// averaged over the ranks (PyTorch's FSDP2 divides by world_size), added to
// what .grad() held (accumulation across backward passes, as always).
// During a unit's forward and backward the same tensors hold the full
// values; do not step an optimizer or change .data() then. A forward in
// grad mode that no backward follows (a validation loss without
// NoGradGuard) leaves the root, and units with reshard_after_forward =
// false, gathered: call reshard(root) before the next optimizer step (a
// step on gathered parameters fails on the shapes; a change made in place
// to them is an InvalidArgument at the next reshard, never lost silently).
//
// Semantics followed from FSDP2:
//   - every rank runs the same units' forwards and backwards in the same
//     order (the gathers and reductions are collectives);
//   - reshard_after_forward = false keeps the gathered parameters from
//     forward to backward (ZeRO-2 behaviour: more memory, no second gather);
//   - the root unit (the one no other unit contains) keeps its parameters
//     gathered between forward and backward (backward starts with it);
//   - set_requires_gradient_sync(unit, false) accumulates full, unreduced
//     gradients locally until a backward with sync on reduces them all;
//   - frozen parameters (requires_grad false) are sharded and gathered but
//     get no gradient.
// Beyond FSDP2: a parameter of a unit that got no gradient on a rank in a
// backward where its unit ran backward counts as zeros there (the ranks
// must make the same collectives); without any unit backward it stays
// undefined. requires_grad may change between iterations. Mixed precision:
// MixedPrecisionPolicy below. The next unit's all-gather is prefetched
// (FullyShardOptions::prefetch). Not yet: CUDA streams (the unit
// collectives are ordered on the host).
//
// What a user must know:
//   - shard the root too (fully_shard(net) after its units): parameters
//     outside every unit are neither sharded nor averaged, so a model whose
//     root is not sharded trains them on each rank's gradients alone and
//     the ranks drift apart, silently, as in FSDP2 (a module cannot see its
//     parent, so nothing can tell at training time); save_checkpoint
//     refuses such a model;
//   - an optimizer step taken while the parameters are gathered (a forward
//     without backward, no reshard) fails on the shapes, but only after
//     the optimizer updated the state of the parameters it reached first:
//     reload that state (a checkpoint) rather than continue;
//   - what the loss needs from a unit must leave its forward as an output
//     (a tensor kept aside, e.g. an auxiliary loss in a member, reads a
//     parameter that was resharded: autograd's "modified by an inplace
//     operation" error in backward, never a silently wrong gradient);
//   - the gradients summed with set_requires_gradient_sync(false) are not
//     in .grad() (they are full-sized): Optimizer::zero_grad() does not
//     clear them; the next backward with sync on reduces them;
//   - buffers (BatchNorm's running statistics) are neither sharded nor
//     synchronised, as in FSDP2; full_state_dict gives the calling rank's;
//   - a 0-dim parameter's shard is a 1-element tensor on rank 0 and an
//     empty one elsewhere.
//
// Errors (ddp::InvalidArgument, nothing sent): fully_shard on a unit whose
// parameters sit in a unit not yet sharded inside it (shard inner units
// first), twice on one unit, on a unit without process group; a parameter
// shared by two units (named); state dicts whose names or shapes differ
// (named). Collectives time out as the group's do.
//
// Thread safety: one thread trains a sharded model (autograd may call the
// hooks from its own threads; each unit serializes them).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "ddp/distributed_data_parallel.h"  // collect_tensors
#include "ddp/mixed_precision_policy.h"
#include "ddp/optimizer_state.h"
#include "ddp/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

struct FullyShardOptions {
  // The group whose ranks share the unit; null: default_group().
  ProcessGroupPtr group;
  // Free the gathered parameters after forward and gather them again for
  // backward (true, FSDP2's default), or keep them (false).
  bool reshard_after_forward = true;
  // Mixed precision (FSDP2's mp_policy). Default: none.
  MixedPrecisionPolicy mp_policy;
  // When this unit's forward (inside the root's) or backward begins, issue
  // the all-gather of the unit that comes next (in the order of the last
  // iteration), so that it runs while this one computes; costs one more
  // unit's full parameters in memory meanwhile. As FSDP2 prefetches.
  bool prefetch = true;
};

namespace detail {
class FsdpUnit;
// Runs a unit's forward: gathers before it, registers the pre-backward
// hooks on its outputs and reshards after it (src/fsdp/fsdp_unit.cc).
void fsdp_pre_forward(FsdpUnit& unit, const std::vector<at::Tensor>& inputs);
void fsdp_post_forward(FsdpUnit& unit, const std::vector<at::Tensor>& outputs,
                       bool outputs_known);
// The unit's MixedPrecisionPolicy in effect: the dtype forward's tensor
// arguments are cast to, and the one its outputs are cast to (nullopt: none).
std::optional<at::ScalarType> fsdp_input_dtype(const FsdpUnit& unit);
std::optional<at::ScalarType> fsdp_output_dtype(const FsdpUnit& unit);
// Throws InvalidArgument: output_dtype set on a unit whose forward returns
// `type`, which holds tensors fully_shard cannot replace.
[[noreturn]] void fsdp_output_not_castable(const FsdpUnit& unit, const char* type);

}  // namespace detail

// What every unit type shares: its sharding state (null until sharded).
class FullyShardUnit {
 public:
  virtual ~FullyShardUnit() = default;
  // The module this unit is (the FullyShardImpl itself, as a Module).
  virtual torch::nn::Module& unit_module() = 0;
  bool is_sharded() const { return fsdp_ != nullptr; }
  detail::FsdpUnit* fsdp_state() const { return fsdp_.get(); }
  void set_fsdp_state(std::shared_ptr<detail::FsdpUnit> s) { fsdp_ = std::move(s); }

 private:
  std::shared_ptr<detail::FsdpUnit> fsdp_;
};

// Impl with a sharding-aware forward (Note [Units are wrapper types]).
template <typename Impl>
class FullyShardImpl : public Impl, public FullyShardUnit {
 public:
  using Impl::Impl;

  torch::nn::Module& unit_module() override { return *this; }

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    detail::FsdpUnit* unit = fsdp_state();
    if (unit == nullptr) return Impl::forward(std::forward<Args>(args)...);
    // MixedPrecisionPolicy::cast_forward_inputs: the casts live in `slots`.
    std::array<at::Tensor, sizeof...(Args)> slots;
    const std::optional<at::ScalarType> in_dtype = detail::fsdp_input_dtype(*unit);
    if (in_dtype) {
      size_t i = 0;
      (detail::fsdp_cast_arg(args, slots[i++], in_dtype), ...);  // a fold: left to right
    }
    std::vector<at::Tensor> inputs;
    {
      size_t i = 0;
      ((slots[i].defined() ? (inputs.push_back(slots[i]), true)
                           : detail::try_collect_tensors(args, inputs),
        ++i),
       ...);
    }
    detail::fsdp_pre_forward(*unit, inputs);
    decltype(auto) out = call_impl<Args...>(slots, std::index_sequence_for<Args...>{}, args...);
    std::vector<at::Tensor> outputs;
    const bool known = detail::try_collect_tensors(out, outputs);
    detail::fsdp_post_forward(*unit, outputs, known);
    if (const std::optional<at::ScalarType> out_dtype = detail::fsdp_output_dtype(*unit)) {
      if constexpr (std::is_reference_v<decltype(out)>) {
        detail::fsdp_output_not_castable(*unit, typeid(out).name());
      } else if (!detail::fsdp_cast_output(out, *out_dtype)) {
        detail::fsdp_output_not_castable(*unit, typeid(out).name());
      }
    }
    return out;
  }

 private:
  // Impl::forward with each argument as given, or its cast (slots[I]).
  template <typename... Args, size_t... I>
  decltype(auto) call_impl(std::array<at::Tensor, sizeof...(Args)>& slots,
                           std::index_sequence<I...>, Args&... args) {
    return Impl::forward(detail::fsdp_pass_arg<Args>(args, slots[I])...);
  }
};

// The holder, as TORCH_MODULE makes one: FullyShard<BlockImpl>(args...)
// constructs BlockImpl's parameters through its own constructor.
// Calling it runs the unit's forward. (ModuleHolder's own operator() cannot
// see a template forward, nor can torch::nn::Sequential or AnyModule: call
// units directly from the parent's forward.)
template <typename Impl>
class FullyShard : public torch::nn::ModuleHolder<FullyShardImpl<Impl>> {
 public:
  using torch::nn::ModuleHolder<FullyShardImpl<Impl>>::ModuleHolder;

  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

// Shards `unit` (a FullyShard<...> holder, or *holder) over the
// group's ranks: its parameters, less those of units inside it (which must
// be sharded already), become this rank's shards. Every rank of the group
// calls it, with the same model (same names, shapes and values: the
// parameters are not broadcast; seed them alike or load a state dict), on
// its device and in its dtype: Module::to() or loading into the module
// afterwards replaces the shards (InvalidArgument at the next forward; use
// load_full_state_dict).
void fully_shard(FullyShardUnit& unit, const FullyShardOptions& options = {});
template <typename Impl>
void fully_shard(const FullyShard<Impl>& unit, const FullyShardOptions& options = {}) {
  fully_shard(static_cast<FullyShardUnit&>(*unit.ptr()), options);
}

// Off: backward accumulates full gradients in each unit of `root`'s tree
// without communicating (FSDP2's set_requires_gradient_sync; the no_sync
// of DDP); the next backward with it on reduces the sum.
void set_requires_gradient_sync(FullyShardUnit& root, bool enabled);

// Frees every gathered parameter of root's tree (they become shards
// again). Not needed after a backward, which reshards everything.
void reshard(FullyShardUnit& root);

// The whole model's parameters and buffers by name, full-sized: gathered on
// every rank (a collective: every rank calls it). For a checkpoint, or to
// compare with an unsharded model.
torch::OrderedDict<std::string, at::Tensor> full_state_dict(FullyShardUnit& root);
// Loads full-sized values (names as full_state_dict gives them) into the
// shards; each rank copies its own rows (values are cast to the
// parameters' dtype). No communication. Strict and all-or-nothing: a
// missing or extra name, or a shape that differs, is an InvalidArgument
// before anything is written. Gathered parameters are resharded first.
void load_full_state_dict(FullyShardUnit& root,
                          const torch::OrderedDict<std::string, at::Tensor>& state);

// The optimizer's state as the unsharded model's optimizer would hold it
// (FSDP2's get_optimizer_state_dict with full_state_dict): every
// per-parameter state tensor of a sharded parameter's shard shape (Adam's
// exp_avg, SGD's momentum_buffer) gathered to the parameter's full shape,
// on every rank; the rest (step counts, each group's options) as they are.
// A collective. The parameters' order is the optimizer's. It loads into an
// unsharded optimizer of the same model or, with
// load_full_optimizer_state_dict, into the shards of any world size.
// Supported optimizers: SGD, Adam, AdamW, Adagrad, RMSprop (others:
// InvalidArgument). Ranks whose optimizer state differs in which
// parameters have state (a step taken on one rank only) fail on every rank
// naming the first such parameter.
OptimizerState full_optimizer_state_dict(FullyShardUnit& root,
                                         const torch::optim::Optimizer& optimizer);
// Takes this rank's rows of every full-shaped state tensor of `state` (as
// full_optimizer_state_dict, or a plain optimizer's state on the unsharded
// model, or a ddp checkpoint's) into `optimizer`, which steps root's
// shards. No communication. Validated first (InvalidArgument naming
// `source` and the parameter): on error the optimizer is unchanged.
void load_full_optimizer_state_dict(FullyShardUnit& root, torch::optim::Optimizer& optimizer,
                                    const OptimizerState& state,
                                    const std::string& source = "state dict");

// Checkpoints (ddp/checkpoint.h) take a sharded root as their model:
// save_checkpoint writes the full state dict and the full optimizer state
// (gathered on every rank, written by rank 0: a file that any world size,
// sharded or not, and torch.load read), and restore_checkpoint loads each
// rank's rows of them. A model that holds sharded units but is not the
// sharded root is refused there.
// For models too big to gather: per-rank sharded checkpoints,
// ddp/sharded_checkpoint.h.

// torch.nn.utils.clip_grad_norm_ over the sharded gradients: the total norm
// of the whole model's gradient (an all_reduce of the shards' sums),
// returned; every gradient scaled by max_norm / (norm + 1e-6) when above.
// norm_type 2 or infinity. A collective.
double clip_grad_norm_(FullyShardUnit& root, double max_norm, double norm_type = 2.0);

}  // namespace ddp
