// Internal: what ddp's checkpoints (src/checkpoint) need to know of
// fully_shard: whether a model is a sharded root, whose state they save and
// load in full (include/ddp/fully_shard.h, "Checkpoints").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ddp/fully_shard.h"
#include "fsdp/shard_layout.h"

namespace ddp::detail {

// The sharded root unit `model` is; null when the model holds no sharded
// unit (an ordinary module). Throws InvalidArgument naming `what` (the
// checkpoint function) when the model holds shards but is not the root of
// their tree: its own parameters would be saved as shards.
FullyShardUnit* checkpoint_root(const torch::nn::Module& model, const char* what);

// root's parameters and buffers by name (named_parameters(),
// named_buffers()), as the unsharded model has them: each parameter a
// tensor of its full shape and dtype without storage of its own (a scalar
// expanded; read only its shape), each buffer itself. For checking a
// checkpoint against the model before anything is gathered or loaded.
std::vector<std::pair<std::string, at::Tensor>> full_shape_state(FullyShardUnit& root);

// For sharded checkpoints (src/checkpoint/sharded_checkpoint.cc): root's
// parameters in named_parameters() order, each with this rank's shard (a
// view the optimizer steps) and its layout, the tree resharded first.
// Throws InvalidArgument when the tree's units do not all shard over
// groups of one size and rank (their rows would not line up).
struct ShardedParam {
  std::string name;
  at::Tensor shard;
  ParamShard layout;
};
std::vector<ShardedParam> sharded_params(FullyShardUnit& root);
// The layout of each of the optimizer's parameters (groups flattened, in
// order); nullopt for a tensor root's tree does not shard.
std::vector<std::optional<ParamShard>> optimizer_layouts(FullyShardUnit& root,
                                                         const torch::optim::Optimizer& optimizer);
// The group root's tree shards over.
ProcessGroupPtr tree_group(FullyShardUnit& root);

}  // namespace ddp::detail
