// Sharded checkpoints of fully_shard models: each rank writes its own
// shards, so no rank ever holds the whole model (FSDP2's sharded state dict
// with torch.distributed.checkpoint, for models too big to gather).
//
//   // every rank of root's group:
//   ddp::save_sharded_checkpoint(dir, *net, &opt, epoch, step);
//   ...
//   if (auto path = ddp::latest_sharded_checkpoint_path(dir)) {
//     ddp::ShardedCheckpointInfo info = ddp::load_sharded_checkpoint(*path, *net, &opt);
//   }
//
// Files, in `dir` (beside ddp/checkpoint.h's full checkpoints, which list
// and prune separately):
//   checkpoint-epoch<E:6>-step<S:12>.ddpshards   the index: epoch, step, the
//       saving world size, the program's metadata; written last
//   checkpoint-epoch<E:6>-step<S:12>.shards/rank-<R>.ddpckpt   rank R's
//       part: its shard of every parameter (named as named_parameters()),
//       the module's buffers, its optimizer state (of its shards) and its
//       RNG state, in ddp's checkpoint format (CRC-checked)
//
// Atomicity: each rank writes its file atomically; rank 0 writes the index
// only after every rank's file is durable, and removes an older index of
// the same name before any rank writes. An index therefore always names a
// complete set; a crash leaves at worst files without an index, which
// loading ignores and the next save of that name replaces.
//
// Any world size: a rank that loads reads the saved ranks' files one at a
// time and copies the rows of its own shards (torch.chunk's dim-0 layout on
// both sides) from each, so the peak memory is its own shards plus one
// saved rank's file, never the whole model. The optimizer state's
// shard-shaped tensors are cut the same way; step counts and options come
// from saved rank 0. Buffers come from saved rank 0. The RNG state is
// restored only when the world size is the same (rank R takes rank R's).
//
// Errors (InvalidArgument, naming the file): a missing or corrupt file, a
// parameter missing from a file or of another shape (another model), an
// optimizer of another type or layout. Both functions are collectives over
// root's group: each rank's outcome is shared, so every rank throws when
// one fails ("rank N could not ..."), and the model and optimizer are
// changed only when every rank could read what it needs.
// Thread safety: as checkpoints (no concurrent training steps).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "ddp/fully_shard.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

struct ShardedSaveOptions {
  // Keep the newest `keep_last` sharded checkpoints in `dir` (0: all).
  int keep_last = 0;
  // Stored in the index; read back in ShardedCheckpointInfo::metadata.
  std::map<std::string, std::string> metadata;
};

// Collective over root's group (root: a sharded root, fully_shard.h).
// `optimizer` (may be null) steps root's shards. Creates `dir` if needed.
// Returns the index's path on every rank. Throws InvalidArgument for a
// negative epoch or step, a directory that cannot be written (naming it).
std::string save_sharded_checkpoint(const std::string& dir, FullyShardUnit& root,
                                    const torch::optim::Optimizer* optimizer, int64_t epoch,
                                    int64_t step, const ShardedSaveOptions& options = {});

struct ShardedCheckpointInfo {
  std::string path;  // the index
  int64_t epoch = 0;
  int64_t step = 0;
  int world_size = 0;  // of the ranks that saved it
  std::map<std::string, std::string> metadata;
};

// The index of the latest complete sharded checkpoint in `dir` (largest
// epoch, then step), or nullopt. Local.
std::optional<std::string> latest_sharded_checkpoint_path(const std::string& dir);

// Collective over root's group: loads the sharded checkpoint whose index is
// `path` into root's shards, buffers and `optimizer` (may be null: the
// parameters only), whatever world size saved it.
ShardedCheckpointInfo load_sharded_checkpoint(const std::string& path, FullyShardUnit& root,
                                              torch::optim::Optimizer* optimizer);

}  // namespace ddp
