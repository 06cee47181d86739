#include "reducer/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <string>

namespace ddp::detail {

std::vector<std::vector<size_t>> compute_bucket_assignment(
    const std::vector<BucketParamInfo>& params, const std::vector<size_t>& order,
    const std::vector<int64_t>& limits_bytes) {
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
    size_t limit_index = 0;  // into limits_bytes
  };
  // Key: (dtype, device) as a string is enough at this scale and keeps the
  // map ordering deterministic.
  std::map<std::string, Open> open;
  std::vector<std::vector<size_t>> closed;
  for (size_t idx : order) {
    const BucketParamInfo& p = params[idx];
    std::string key = std::string(c10::toString(p.dtype)) + "/" + p.device.str();
    Open& b = open[key];
    b.members.push_back(idx);
    b.bytes += p.bytes;
    if (b.bytes >= limits_bytes[b.limit_index]) {
      closed.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.limit_index = std::min(b.limit_index + 1, limits_bytes.size() - 1);
    }
  }
  for (auto& kv : open) {
    if (!kv.second.members.empty()) closed.push_back(std::move(kv.second.members));
  }
  // Order buckets by the position of their first parameter in `order`.
  std::vector<size_t> position(params.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::sort(closed.begin(), closed.end(),
            [&](const std::vector<size_t>& a, const std::vector<size_t>& b) {
              return position[a.front()] < position[b.front()];
            });
  return closed;
}

}  // namespace ddp::detail
