#include "model_sync.h"

#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <sstream>

#include "ddp/error.h"
#include "process_group_impl.h"

namespace ddp::detail {
namespace {

std::string describe(const NamedTensor& t) {
  return fmt::format("{} '{}' [{}] {}{}", t.kind, t.name, fmt::join(t.tensor.sizes(), ", "),
                     c10::toString(t.tensor.scalar_type()),
                     t.tensor.requires_grad() ? "" : " (frozen)");
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// This rank's complaint about rank 0's list, or "" when they agree.
std::string compare(const std::vector<std::string>& root,
                    const std::vector<std::string>& mine, int rank) {
  for (size_t i = 0; i < std::min(root.size(), mine.size()); ++i) {
    if (root[i] != mine[i]) {
      return fmt::format("tensor {}: rank 0 has {} but rank {} has {}", i, root[i], rank,
                         mine[i]);
    }
  }
  if (root.size() != mine.size()) {
    const auto& longer = root.size() > mine.size() ? root : mine;
    return fmt::format(
        "rank 0 has {} parameters and buffers but rank {} has {}; the first "
        "one only {} has: {}",
        root.size(), rank, mine.size(),
        root.size() > mine.size() ? "rank 0" : fmt::format("rank {}", rank),
        longer[std::min(root.size(), mine.size())]);
  }
  return "";
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
