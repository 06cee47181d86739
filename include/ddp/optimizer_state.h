// OptimizerState: an optimizer's whole state as plain data, and
// ShardedOptimizer: the interface through which checkpoints save and restore
// an optimizer whose state is spread over the ranks.
//
// An OptimizerState is what Python's optimizer.state_dict() holds: the type,
// each parameter group's options (lr, betas, ...), and per parameter its
// state (momentum buffer, Adam's exp_avg and exp_avg_sq, step), in
// param_groups() order. ddp's checkpoints store one (Checkpoint::optimizer);
// ZeroRedundancyOptimizer::state_dict() returns the consolidated one of the
// equivalent unsharded optimizer, so a checkpoint moves between a sharded
// and a plain optimizer and across world sizes. Values, not references:
// tensors are copies on the device they were read to (CPU for a capture).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

// One named value of an optimizer's options or of a parameter's state
// ("lr" a real, "momentum_buffer" a tensor, "step" an integer, "amsgrad" a
// bool): the names of libtorch's option and state accessors.
struct OptimizerField {
  enum class Kind : uint8_t { kTensor = 0, kInt = 1, kReal = 2, kBool = 3 };
  std::string name;
  Kind kind = Kind::kReal;
  at::Tensor tensor;  // kTensor; may be undefined (an unused buffer)
  int64_t integer = 0;
  double real = 0;
  bool flag = false;
};
using OptimizerFields = std::vector<OptimizerField>;

struct OptimizerState {
  // "SGD", "Adam", "AdamW", "Adagrad", "RMSprop" (kept field by field), or
  // "archive:<C++ type>" for any other optimizer, kept as libtorch's own
  // archive bytes (Optimizer::save) plus each group's lr.
  std::string type;
  struct Group {
    OptimizerFields options;
    // Per parameter of the group, in order; nullopt: no state yet (before
    // its first step).
    std::vector<std::optional<OptimizerFields>> state;
  };
  std::vector<Group> groups;
  std::string archive;  // libtorch archive bytes ("archive:" types only)
};

// An optimizer whose state lives in shards on the ranks of a process group
// (ZeroRedundancyOptimizer). save_checkpoint and restore_checkpoint find it
// by this interface: they consolidate before saving and hand every rank the
// full state to take its shard from. Implementations are torch::optim
// optimizers too.
class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;
  // The group the shards are spread over (null: a single process).
  virtual const ProcessGroupPtr& group() const = 0;
  // Collective: rank `to` of the group receives the full state; the others
  // send their shards.
  virtual void consolidate_state_dict(int to) const = 0;
  // On the rank consolidated to: the full state as of the last
  // consolidate_state_dict(). Throws InvalidArgument elsewhere, or when it
  // is stale.
  virtual std::shared_ptr<const OptimizerState> state_dict() const = 0;
  // Every rank: takes its shard of a full state saved by any world size (or
  // by the equivalent unsharded optimizer). Validates first: on error
  // nothing changed. `source` names the state in errors.
  virtual void load_state_dict(const OptimizerState& state, const std::string& source) = 0;
};

}  // namespace ddp
