#include "fsdp/shard_layout.h"

#include <algorithm>

namespace ddp::detail {

UnitShardLayout unit_shard_layout(const std::vector<std::vector<int64_t>>& sizes, int rank,
                                  int world_size) {
  UnitShardLayout layout;
  for (const std::vector<int64_t>& full : sizes) {
    ParamShard p;
    p.full_sizes = full;
    p.rows = full.empty() ? 1 : full[0];
    p.row_numel = 1;
    for (size_t d = 1; d < full.size(); ++d) p.row_numel *= full[d];
    p.chunk_rows = (p.rows + world_size - 1) / world_size;
    p.local_rows = std::clamp<int64_t>(p.rows - rank * p.chunk_rows, 0, p.chunk_rows);
    p.shard_sizes = full.empty() ? std::vector<int64_t>{p.local_rows} : full;
    p.shard_sizes[0] = p.local_rows;
    p.offset = layout.shard_numel;
    layout.shard_numel += p.padded_numel();
    layout.params.push_back(std::move(p));
  }
  return layout;
}

}  // namespace ddp::detail
