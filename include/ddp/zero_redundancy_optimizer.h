// ZeroRedundancyOptimizer: an optimizer whose state is sharded across the
// ranks (torch.distributed.optim.ZeroRedundancyOptimizer, ZeRO stage 1).
//
//   ddp::DistributedDataParallel<Net> model(net);
//   ddp::ZeroRedundancyOptimizer opt(model.parameters(), torch::optim::AdamOptions(1e-3));
//   ... opt.zero_grad(); loss.backward(); opt.step(); ...
//
// Data parallelism keeps a full optimizer on every rank: Adam's two moments
// cost twice the model's size on each. Here the parameters are partitioned
// across the ranks as PyTorch does (per parameter group, largest first, each
// to the rank with the fewest elements so far; ties to the lower rank), each
// rank's optimizer of the given class holds state for its own shard only,
// and step() runs it on that shard, then every rank broadcasts its updated
// parameters to the others (one coalesced broadcast per rank, dtype and
// 25 MiB chunk, in rank order: the flat copy is bounded like a DDP bucket).
// Parameters are not split: a rank's share is at least its largest
// parameter's state, so a model dominated by one matrix shards poorly (as
// in PyTorch). The optimizer state per rank is about 1/W
// of the unsharded one; the parameters after each step are those of the
// unsharded optimizer (bit for bit for element-wise optimizers such as SGD
// and Adam: each element is updated by the same arithmetic on its owner).
//
// It is a torch::optim::Optimizer: param_groups() holds every parameter
// with the group's options (an LR scheduler sets them there; step() hands
// them to the shard's optimizer first), zero_grad() clears every gradient,
// and save()/load() (torch::save(opt, file)) write and read the full state.
//
// Full state, for checkpoints: consolidate_state_dict(to) gathers every
// shard on rank `to`; state_dict() there returns the state of the
// equivalent unsharded optimizer, in the format of ddp's checkpoints
// (Checkpoint::optimizer), so a checkpoint saved with ZeRO restores into a
// plain optimizer and the other way round. load_state_dict() takes such a
// state on every rank and keeps its own shard: the world size may differ
// from the one that saved it. ddp::save_checkpoint consolidates by itself
// (it is a collective already) and ddp::restore_checkpoint re-shards.
// Supported for state: SGD, Adam, AdamW, Adagrad, RMSprop (ddp's checkpoint
// codecs); another class trains but its state cannot be consolidated.
//
// Uneven inputs: pass it to ddp::join(model, {&opt}, loop): a rank that ran
// out of inputs shadows each step (PyTorch's Joinable): it steps its shard
// with the gradients DDP's shadow all_reduce gave it and broadcasts it, so
// the ranks still training get every shard updated.
//
// Collectives: the constructor (every rank checks every rank's parameter
// list), step() and consolidate_state_dict(); they run on `process_group`
// (default: the default group), in the same order on every rank. Every rank must
// construct it with the same optimizer class and options (not checked: each
// owner applies its own). state_dict(), save(), load_state_dict() and
// load() do not communicate.
//
// Not PyTorch's: the wrapper's own state() is empty (the shard optimizer,
// local_optimizer(), holds this rank's); add_param_group() after
// construction is refused at the next step() (libtorch's is not virtual, so
// the partition cannot follow it).
//
// Errors: InvalidArgument, on every rank, for no parameters or a parameter
// listed twice on any rank, parameters added after construction, and a
// state that does not fit (naming the group and parameter; checked against
// every parameter on every rank); on one rank for a state_dict() or save()
// where nothing current was consolidated; MismatchError when the ranks'
// parameter lists differ; TimeoutError/CommError from the collectives.
// Thread safety: one thread per rank, as any optimizer.
#pragma once

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/join.h"
#include "ddp/optimizer_state.h"
#include "ddp/process_group.h"

namespace ddp {

// The libtorch optimizer class whose options type is O (for the built-ins).
template <typename O> struct optimizer_for_options;
template <> struct optimizer_for_options<torch::optim::SGDOptions> { using type = torch::optim::SGD; };
template <> struct optimizer_for_options<torch::optim::AdamOptions> { using type = torch::optim::Adam; };
template <> struct optimizer_for_options<torch::optim::AdamWOptions> { using type = torch::optim::AdamW; };
template <> struct optimizer_for_options<torch::optim::AdagradOptions> { using type = torch::optim::Adagrad; };
template <> struct optimizer_for_options<torch::optim::RMSpropOptions> { using type = torch::optim::RMSprop; };

struct ZeroRedundancyOptimizerOptions {
  ProcessGroupPtr process_group;  // Note [Null process group] (process_group.h)
};

class ZeroRedundancyOptimizer : public torch::optim::Optimizer,
                                public JoinHook,
                                public ShardedOptimizer {
 public:
  // Builds the shard's optimizer from its parameter groups: one per group
  // given, with that group's options (or `defaults`), holding the
  // parameters this rank owns (possibly none).
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup>)>;

  // With a built-in optimizer chosen by its options type:
  //   ZeroRedundancyOptimizer opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  // Collective (see above).
  template <typename Options, typename Optim = typename optimizer_for_options<Options>::type>
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                          const Options& defaults, ZeroRedundancyOptimizerOptions options = {})
      : ZeroRedundancyOptimizer(std::move(groups), std::make_unique<Options>(defaults),
                                factory_of<Optim>(defaults),
                                std::move(options)) {}
  template <typename Options, typename Optim = typename optimizer_for_options<Options>::type>
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const Options& defaults,
                          ZeroRedundancyOptimizerOptions options = {})
      : ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup>{
                                    torch::optim::OptimizerParamGroup(std::move(params))},
                                defaults, std::move(options)) {}
  // Any optimizer class, through a factory (its state cannot be
  // consolidated unless it is one of the built-ins).
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                          std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                          Factory factory, ZeroRedundancyOptimizerOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  // Collective: the shard's optimizer steps (with param_groups()' current
  // options), then every rank's shard is broadcast from its owner. Returns
  // the closure's loss as the inner optimizer does.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Collective: rank `to` (of the group) receives every rank's shard state;
  // the others send theirs. Call it after the step whose state you want.
  void consolidate_state_dict(int to = 0) const override;
  // On the rank consolidated to: the full state (of the equivalent
  // unsharded optimizer), as of the last consolidate_state_dict(). Throws
  // InvalidArgument elsewhere, or when step() ran since (step() drops a
  // consolidated state: it would be stale, and it is the whole state).
  std::shared_ptr<const OptimizerState> state_dict() const override;
  // Every rank: takes its shard of a full state (from state_dict() or a
  // checkpoint saved by any world size, or by a plain optimizer of the same
  // class and parameter groups) and the groups' options. Validates first:
  // on error nothing changed. `source` names the state in errors.
  void load_state_dict(const OptimizerState& state,
                       const std::string& source = "state") override;

  // torch::save/torch::load: save() writes the full state, on the rank
  // consolidated to only (throws elsewhere: call torch::save there alone);
  // load() reads it on every rank and keeps this rank's shard.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The group it runs on (null: a single process without one).
  const ProcessGroupPtr& group() const override { return group_; }
  // Which rank owns each parameter of each group (param_groups() order).
  const std::vector<std::vector<int>>& partition() const { return owner_; }
  // The shard's optimizer (its state is this rank's share).
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }
  // Bytes of optimizer state tensors held by this rank.
  int64_t state_bytes() const;

  // JoinHook: a finished rank's shadow of step().
  void main_hook() override;

 private:
  template <typename Optim, typename Options>
  static Factory factory_of(const Options& defaults) {
    return [defaults](std::vector<torch::optim::OptimizerParamGroup> groups) {
      return std::unique_ptr<torch::optim::Optimizer>(new Optim(std::move(groups), defaults));
    };
  }
  void sync_options_to_local() const;
  void check_params_on_every_rank() const;
  void check_same_params_on_every_rank() const;
  void check_partition_current() const;

  Factory factory_;
  void broadcast_shards();

  ProcessGroupPtr group_;
  std::vector<std::vector<int>> owner_;  // [group][param] -> rank
  std::vector<std::vector<at::Tensor>> shard_of_rank_;  // [rank] -> its params
  std::unique_ptr<torch::optim::Optimizer> local_;
  mutable std::shared_ptr<const OptimizerState> consolidated_;
  mutable bool dropped_by_step_ = false;  // state_dict() says why it has none
  mutable int consolidated_to_ = -1;       // the rank of the last consolidation
};

// Bytes of the state tensors `optimizer` holds (momentum buffers, Adam's
// moments; a ZeroRedundancyOptimizer: this rank's shard), counted in place.
// SGD, Adam, AdamW, Adagrad, RMSprop; -1 for another class.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
