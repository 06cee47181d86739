// Where each parameter of a fully_shard unit lies in the unit's flat shard
// (Note [Units are wrapper types] in include/ddp/fully_shard.h gives the
// user's view). Pure arithmetic, no tensors: unit-tested on its own.
//
// FSDP2's layout: a parameter of `rows` rows (dim 0; a 0-dim one counts as
// one row of one element) is cut as torch.chunk(param, W, 0) cuts it:
// chunk_rows = ceil(rows / W), rank r owns rows [r*chunk_rows,
// min((r+1)*chunk_rows, rows)), possibly none. Every rank pads its piece to
// chunk_rows rows, and a unit's padded pieces lie back to back in its flat
// shard, so one all-gather of the flat shards ([W, S] in rank order) holds
// every parameter's chunks, and one reduce-scatter of the same layout gives
// each rank its gradient shard.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::detail {

struct ParamShard {
  std::vector<int64_t> full_sizes;   // the parameter's shape
  std::vector<int64_t> shard_sizes;  // this rank's piece: [local_rows, rest...]
  int64_t rows = 0;                  // full_sizes[0] (1 for a 0-dim one)
  int64_t row_numel = 0;             // elements per row (0 when any dim is 0)
  int64_t chunk_rows = 0;            // ceil(rows / W)
  int64_t local_rows = 0;            // rows this rank owns, 0..chunk_rows
  int64_t offset = 0;                // in the flat shard, elements
  int64_t padded_numel() const { return chunk_rows * row_numel; }
  int64_t local_numel() const { return local_rows * row_numel; }
};

struct UnitShardLayout {
  std::vector<ParamShard> params;
  int64_t shard_numel = 0;  // S: one rank's flat shard, padding included
};

UnitShardLayout unit_shard_layout(const std::vector<std::vector<int64_t>>& sizes, int rank,
                                  int world_size);

}  // namespace ddp::detail
