// One fully_shard unit's parameters and their life through an iteration,
// and the tree of units under a root (include/ddp/fully_shard.h for the
// user's view).
//
// Note [Shard and full in one parameter]: the optimizer must hold the
// module's own parameter tensors (their names, their identity in
// Optimizer::state()), and the module's forward must read the same tensors.
// So each parameter's TensorImpl takes turns: sharded, its data is a view of
// the unit's flat shard ([local_rows, ...]; the optimizer steps it in
// place); unsharded (forward and backward), its data is `full`, a tensor of
// the full shape whose storage is allocated by each gather and released by
// each reshard (storage nbytes 0, the same StorageImpl). Views that
// autograd saved during forward (a transposed weight) keep that
// StorageImpl, so the gather before backward refills what they read. The
// parameter's grad accumulator is taken while the parameter is full-sized
// (fully_shard), so autograd's shape checks see the full shape; while a
// unit's backward runs its parameters' .grad() holds the new full gradient
// and the shard gradient waits in `stashed_grad`. Between a forward that
// keeps the parameters gathered and its backward, .grad() keeps the shard
// gradient: an optimizer step then fails on the shapes instead of silently
// skipping parameters whose gradient was put aside. While sharded, the
// parameter counts its versions on a stand-in counter, one ahead of its
// own: a node autograd saved the parameter in, and which runs before the
// unit's pre-backward gathers it again (a use outside the unit's outputs:
// an auxiliary loss kept in a member), fails autograd's version check
// instead of reading the shard; at the gather the parameter's own counter
// comes back, advanced by the in-place changes (an optimizer step) made
// meanwhile, so those fail the check too.
//
// Note [Mixed precision in one parameter]: with a MixedPrecisionPolicy's
// param_dtype the gathered parameter is, say, bfloat16 while its shard
// stays float32, so the TensorImpl changes dtype at every gather and
// reshard. Variable::set_data() drops the parameter's grad accumulator on
// a dtype change, and the next forward would make a new one without the
// hook and with the gathered dtype; so for a dtype change the data is
// swapped with TensorImpl::shallow_copy_from (what set_data does after its
// checks), keeping the one accumulator made at fully_shard (float32, full
// shape). Autograd's engine casts each gradient to its accumulator's
// recorded dtype (validate_outputs), so the bfloat16 gradient arrives
// float32 in .grad(), a lossless widening; pack_grads casts it to the
// reduce dtype, as FSDP2 casts its bfloat16 gradient. The values are
// FSDP2's: the same casts of the same numbers.
//
// Note [Prefetching]: a unit's all-gather can be issued before its forward
// (or backward) needs it, so that it runs while the unit before it
// computes. When a unit's forward begins inside the root's forward, the
// all-gather of the unit that began next in the last whole forward is
// issued; when a unit's backward begins, that of the unit backward reached
// next then (the reverse of the order forwards ended). The order is the
// last iteration's, the same on every rank as the units' order must be, so
// every rank issues the same collectives in the same order. A gather issued
// ahead is consumed by the unit's own unshard, or, if that unit did not run
// this time, dropped (waited for and discarded) when the root's forward
// ends and when backward ends: no gathered value outlives the iteration
// in which it was gathered, so none is read after an optimizer step.
//
// Note [Unit backward protocol]: every collective of a tree must come in the
// same order on every rank, so each one is issued at a point the graph's
// structure fixes, never at a point that depends on which gradients a rank
// happens to produce. Pre-backward = a hook on the unit's forward outputs
// (the first gradient to reach any of them): gather again when resharded,
// and queue the tree's end-of-backward callback once. Post-backward = a hook
// on each of forward's tensor inputs that require grad (FSDP2's
// RegisterPostBackwardFunction): when all of them have their gradient, the
// unit's backward is over (the engine runs the unit's nodes, and the grad
// accumulators, before the node producing the input), so its gradients go
// to one reduce-scatter (async; the backward of earlier units runs
// meanwhile), with zeros for parameters that got none on this rank, and the
// full gradients and parameters are freed. Units whose inputs need no
// gradient (the first layers, usually the root) are reduced by the
// end-of-backward callback, in the order their backwards began; it then
// waits for every reduce-scatter, reshards every unit still gathered and
// adds each shard gradient to the stashed one. A grad accumulator hook on
// each trainable parameter catches a gradient that arrives after its unit
// was reduced (a use outside the unit's forward): an error, not a lost
// gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "compat/autograd_compat.h"
#include "ddp/collectives.h"
#include "ddp/fully_shard.h"
#include "fsdp/shard_layout.h"

namespace ddp::detail {

struct FsdpTree;

struct FsdpParam {
  std::string name;  // as the root's named_parameters() gives it
  at::Tensor param;  // the module's own parameter (Note [Shard and full ...])
  ParamShard layout;
  at::Tensor shard;          // view of the unit's flat shard
  at::Tensor full;           // full-shaped; storage freed while sharded
  at::Tensor stashed_grad;   // the shard gradient while unsharded
  at::Tensor unsynced_grad;  // full gradients summed while sync is off
  compat::NodePtr accumulator;
  uintptr_t hook_key = 0;
  int64_t version_at_gather = 0;  // to catch a step on the full parameter
  // While sharded, the parameter's own version counter is put aside here
  // and it counts on a stand-in (Note [Shard and full in one parameter]).
  std::optional<c10::VariableVersion> real_version;
};

class FsdpUnit : public std::enable_shared_from_this<FsdpUnit> {
 public:
  // params: the unit's own parameters, (name under the unit, tensor).
  static std::shared_ptr<FsdpUnit> create(std::string unit_name,
                                          std::vector<std::pair<std::string, at::Tensor>> params,
                                          const FullyShardOptions& options);
  ~FsdpUnit();

  // inputs: forward's tensor arguments (Note [Unit backward protocol]).
  void pre_forward(const std::vector<at::Tensor>& inputs);
  void post_forward(const std::vector<at::Tensor>& outputs, bool outputs_known);
  void reset_backward_counts();  // a new iteration: no post-backward expected
  void reshard();
  // Note [Prefetching]: the all-gather issued ahead, consumed by the
  // unit's own unshard (its forward or pre-backward), or dropped.
  void begin_unshard();
  void drop_gather();  // waits for a gather issued ahead and discards it
  // Gathers issued ahead that the unit used, and that were dropped.
  int64_t prefetches_used() const { return prefetches_used_; }
  int64_t prefetches_dropped() const { return prefetches_dropped_; }

  // Note [Unit backward protocol], driven by FsdpTree under its mutex.
  bool packed() const { return phase_ == Phase::kPacked; }
  bool in_backward() const { return phase_ == Phase::kInBackward; }
  void pack_grads();    // gradients into the reduce buffer; reshard
  void issue_reduce();  // the reduce-scatter, async
  void finish_reduce();  // wait; add the shards into .grad()

  const std::string& name() const { return name_; }
  // MixedPrecisionPolicy in effect (FSDP2's clamping): null when it equals
  // the parameters' own dtype.
  std::optional<at::ScalarType> input_dtype() const;
  std::optional<at::ScalarType> output_dtype() const { return options_.mp_policy.output_dtype; }
  std::vector<FsdpParam>& params() { return params_; }
  ProcessGroupPtr group() const { return group_; }
  std::shared_ptr<FsdpTree> tree() const { return tree_; }
  void set_tree(std::shared_ptr<FsdpTree> tree) { tree_ = std::move(tree); }
  bool is_root() const;
  // Rank-wide values of a parameter (a collective): its full tensor.
  at::Tensor gather_full(size_t index);

 private:
  FsdpUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params,
           const FullyShardOptions& options);
  void install_hooks();
  void sync_hooks();
  bool any_trainable() const;
  void unshard();
  void check_holds_shard() const;
  void finish_unshard();
  void prefetch_next(const std::vector<std::weak_ptr<FsdpUnit>>& order);
  void pre_backward();
  void post_backward();
  void on_grad_ready(size_t index);
  void assign_data(FsdpParam& p, const at::Tensor& data);

  std::string name_;
  FullyShardOptions options_;
  ProcessGroupPtr group_;
  std::vector<FsdpParam> params_;
  at::Tensor flat_shard_;  // [S], padding zero
  // Note [Mixed precision in one parameter]: the parameters' own dtype,
  // the gathered parameters' (param_dtype or own), the reduce-scatter's.
  at::ScalarType own_dtype_ = at::kFloat;
  at::ScalarType compute_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  int64_t shard_numel_ = 0;
  bool unsharded_ = false;
  // An all-gather in flight (Note [Prefetching]): its input (the shard,
  // cast to the compute dtype) and output, kept alive until it is waited.
  bool gather_pending_ = false;
  at::Tensor gather_input_;
  at::Tensor gathered_;
  Work gather_work_;
  int64_t prefetches_used_ = 0, prefetches_dropped_ = 0;
  bool grads_stashed_ = false;  // from pre-backward to reshard
  enum class Phase { kIdle, kInBackward, kPacked, kIssued };
  Phase phase_ = Phase::kIdle;  // this backward's progress
  bool needs_reduce_ = false;   // packed with gradient sync on
  int post_backward_expected_ = 0;  // input hooks registered since the last backward
  int post_backward_seen_ = 0;
  // The reduce-scatter in flight: its output (S elements) and handle.
  at::Tensor reduced_;
  at::Tensor reduce_input_;
  Work reduce_work_;
  std::shared_ptr<FsdpTree> tree_;
};

// Every unit under one root (the root last), and the per-backward state.
struct FsdpTree {
  std::vector<std::weak_ptr<FsdpUnit>> units;  // the root last
  std::vector<std::shared_ptr<FsdpUnit>> backward_order;  // this backward's units
  bool grad_sync = true;
  bool callback_queued = false;
  // Note [Prefetching]: the units in the order the last whole forward (the
  // root's) began them, and in the reverse of the order it ended them (the
  // order backward reaches them); the forward being recorded.
  std::vector<std::weak_ptr<FsdpUnit>> forward_order, backward_prefetch_order;
  std::vector<std::weak_ptr<FsdpUnit>> recording_begin, recording_end;
  bool in_forward = false;  // between the root's pre- and post-forward
  void drop_gathers();
  std::recursive_mutex mu;  // hooks may run on autograd's threads

  void queue_end_of_backward();
  void end_of_backward();
  void reshard_all();  // and forget expected post-backwards
};

// Note [Shard and full in one parameter]'s mechanics (fsdp_gather.cc): the
// full tensor's bytes allocated and released under its one StorageImpl; the
// stand-in version counter put aside and the real one restored.
void allocate_storage(const at::Tensor& t);
void release_storage(const at::Tensor& t);
void put_version_aside(FsdpParam& p);
void restore_version(FsdpParam& p);

// root's sharding state; InvalidArgument naming `what` (the public
// function) when root is not sharded.
FsdpUnit& sharded_root(FullyShardUnit& root, const char* what);
// Each parameter of root's tree by TensorImpl: (its unit, its index there).
using ParamIndex =
    std::unordered_map<const c10::TensorImpl*, std::pair<FsdpUnit*, size_t>>;
ParamIndex param_index(FsdpUnit& root);
// The unit's name in messages ("BlockImpl").
std::string unit_name_of(const torch::nn::Module& m);

// The full tensor of which `local` is this rank's rows (shape
// layout.shard_sizes, e.g. a parameter's shard or an optimizer state of
// it): padded, all-gathered over `group`, trimmed. A collective.
at::Tensor gather_rows(const ParamShard& layout, const at::Tensor& local,
                       const ProcessGroupPtr& group);
// This rank's rows of `full` (shape layout.full_sizes), a copy.
at::Tensor local_rows(const ParamShard& layout, const at::Tensor& full, int rank);

}  // namespace ddp::detail
