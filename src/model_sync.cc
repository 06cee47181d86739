#include "model_sync.h"

#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <sstream>

#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp::detail {
namespace {

// "parameter 'fc.weight' float32[16, 8]" (tensor_text.h), " (frozen)" added
// when it does not require grad.
std::string describe(const NamedTensor& t) {
  return fmt::format("{} '{}' {}{}", t.kind, t.name, describe_tensor(t.tensor),
                     t.tensor.requires_grad() ? "" : " (frozen)");
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// This rank's complaint about rank 0's list, or "" when they agree: the
// count first, then the first tensor that differs.
std::string compare(const std::vector<std::string>& root,
                    const std::vector<std::string>& mine, int rank) {
  size_t first = 0;
  while (first < root.size() && first < mine.size() && root[first] == mine[first]) ++first;
  auto at = [](const std::vector<std::string>& v, size_t i) {
    return i < v.size() ? v[i] : std::string("nothing");
  };
  std::string difference = fmt::format("at position {} rank 0 has {} but rank {} has {}",
                                       first, at(root, first), rank, at(mine, first));
  if (root.size() != mine.size()) {
    return fmt::format("rank 0 has {} parameters and buffers but rank {} has {}; {}",
                       root.size(), rank, mine.size(), difference);
  }
  return first < root.size() ? difference : "";
}

}  // namespace

void verify_same_model(const std::vector<NamedTensor>& tensors,
                       const CollectiveOptions& options) {
  std::string mine;
  for (const auto& t : tensors) mine += describe(t) + "\n";
  std::string root = broadcast_string(mine, 0, options);
  int rank = resolve_group(options).rank();
  std::string complaint =
      rank == 0 ? "" : compare(split_lines(root), split_lines(mine), rank);
  for (const std::string& c : all_gather_string(complaint, options)) {
    if (c.empty()) continue;
    throw MismatchError(fmt::format(
        "DistributedDataParallel: the model differs across ranks: {}. Every "
        "rank must construct the same model (same parameters and buffers, "
        "registered in the same order, same shapes and dtypes) before "
        "wrapping it",
        c));
  }
}

void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int src,
                         const CollectiveOptions& options, int64_t chunk_bytes) {
  at::NoGradGuard no_grad;
  // Group by (dtype, device), keeping order; cut groups at chunk_bytes.
  std::map<std::string, std::vector<std::vector<at::Tensor>>> groups;
  std::vector<std::string> keys;
  std::map<std::string, int64_t> bytes;
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    std::string key = fmt::format("{}/{}", c10::toString(t.scalar_type()), t.device().str());
    auto& g = groups[key];
    int64_t nb = t.numel() * t.element_size();
    if (g.empty() || bytes[key] + nb > chunk_bytes) {
      g.emplace_back();
      bytes[key] = 0;
      keys.push_back(key);
    }
    g.back().push_back(t);
    bytes[key] += nb;
  }
  std::map<std::string, size_t> next;
  for (const std::string& key : keys) {
    const auto& chunk = groups[key][next[key]++];
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : chunk) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    broadcast(flat, src, options);
    int64_t offset = 0;
    for (const auto& t : chunk) {
      at::Tensor dst = t;
      dst.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace ddp::detail
