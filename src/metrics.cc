#include "ddp/metrics.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "call_scope.h"
#include "ddp/error.h"

namespace ddp {
namespace {

int group_size(const CollectiveOptions& options) {
  return (options.group ? options.group : default_group())->size();
}

// Sums a vector of doubles over the group in place with one all_reduce.
void all_reduce_doubles(std::vector<double>& values,
                        const CollectiveOptions& options) {
  at::Tensor t = at::from_blob(values.data(),
                               {static_cast<int64_t>(values.size())},
                               at::TensorOptions().dtype(at::kDouble));
  all_reduce(t, ReduceOp::SUM, options);
}

// An int64 travels as two double slots, low 32 bits (unsigned) and high 32
// bits (signed): each rank's slot is below 2^32 in magnitude, so the sums
// stay exact in a double's 53-bit mantissa for up to 2^21 ranks, and the
// total is rebuilt modulo 2^64.
void push_int64(std::vector<double>& out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  out.push_back(static_cast<double>(u & 0xffffffffu));
  out.push_back(static_cast<double>(static_cast<int32_t>(u >> 32)));
}
int64_t pop_int64(const double* slots) {
  uint64_t lo = static_cast<uint64_t>(static_cast<int64_t>(slots[0]));
  uint64_t hi = static_cast<uint64_t>(static_cast<int64_t>(slots[1]));
  return static_cast<int64_t>(lo + (hi << 32));
}

void check_weight(const char* where, const std::string& name, double weight) {
  if (!(weight >= 0)) {
    throw InvalidArgument(std::string(where) + ": weight of '" + name +
                          "' is " + std::to_string(weight) +
                          "; weights must be >= 0 (pass the sample count)");
  }
}

// 16-bit FNV-1a of the names and kinds, in sorted order.
uint32_t layout_hash(const std::vector<std::pair<std::string, MetricKind>>& l) {
  uint32_t h = 2166136261u;
  for (const auto& [name, kind] : l) {
    for (unsigned char c : name) h = (h ^ c) * 16777619u;
    h = (h ^ (0x100u + static_cast<uint32_t>(kind))) * 16777619u;
  }
  return (h >> 16) ^ (h & 0xffffu);
}

}  // namespace

const char* to_string(MetricKind kind) {
  switch (kind) {
    case MetricKind::kSum: return "sum";
    case MetricKind::kMean: return "mean";
    case MetricKind::kCount: return "count";
  }
  return "?";
}

// Note [Call labels] (call_scope.h).
constexpr const char* kMetricsAdvice =
    "The metrics' reductions are collective: every rank of the group calls them, at the same "
    "point (a rank without data still calls them, adding nothing)";

double all_reduce_sum(double value, const CollectiveOptions& options) {
  const detail::CallScope call("all_reduce_sum", kMetricsAdvice);
  std::vector<double> v{value};
  all_reduce_doubles(v, options);
  return v[0];
}

double all_reduce_mean(double value, const CollectiveOptions& options) {
  const detail::CallScope call("all_reduce_mean", kMetricsAdvice);
  std::vector<double> v{value};
  all_reduce_doubles(v, options);
  return v[0] / group_size(options);
}

double all_reduce_weighted_mean(double value_sum, double weight,
                            const CollectiveOptions& options) {
  check_weight("all_reduce_weighted_mean", "weight", weight);
  const detail::CallScope call("all_reduce_weighted_mean", kMetricsAdvice);
  std::vector<double> v{value_sum, weight};
  all_reduce_doubles(v, options);
  if (v[1] == 0) return std::numeric_limits<double>::quiet_NaN();
  return v[0] / v[1];
}

int64_t all_reduce_count(int64_t count, const CollectiveOptions& options) {
  const detail::CallScope call("all_reduce_count", kMetricsAdvice);
  std::vector<int64_t> v{count};
  at::Tensor t = at::from_blob(v.data(), {1},
                               at::TensorOptions().dtype(at::kLong));
  all_reduce(t, ReduceOp::SUM, options);
  return v[0];
}

// --- ReducedMetrics ---------------------------------------------------------

const ReducedMetrics::Entry& ReducedMetrics::at(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string known;
    for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.first;
    throw InvalidArgument("metric '" + name + "' was not added (known: " +
                          (known.empty() ? "none" : known) +
                          "); add it with Metrics::add_* on every rank");
  }
  return it->second;
}

double ReducedMetrics::value(const std::string& name) const {
  return at(name).value;
}
int64_t ReducedMetrics::count(const std::string& name) const {
  return at(name).count;
}
bool ReducedMetrics::contains(const std::string& name) const {
  return entries_.count(name) != 0;
}

std::string ReducedMetrics::to_string() const {
  std::string out;
  for (const auto& [name, e] : entries_) {
    char buf[64];
    if (e.kind == MetricKind::kCount) {
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(e.count));
    } else {
      std::snprintf(buf, sizeof(buf), "%.6g", e.value);
    }
    out += (out.empty() ? "" : " ") + name + "=" + buf;
  }
  return out;
}

// --- Metrics ----------------------------------------------------------------

Metrics::Accumulator& Metrics::slot(const std::string& name, MetricKind kind) {
  auto [it, inserted] = metrics_.try_emplace(name);
  if (inserted) {
    it->second.kind = kind;
  } else if (it->second.kind != kind) {
    throw InvalidArgument("metric '" + name + "' was added as a " +
                          ddp::to_string(it->second.kind) +
                          " and is now added as a " + ddp::to_string(kind) +
                          "; use one kind per name");
  }
  return it->second;
}

void Metrics::add_sum(const std::string& name, double value) {
  Accumulator& a = slot(name, MetricKind::kSum);
  a.sum += value;
  a.count += 1;
}

void Metrics::add_mean(const std::string& name, double value, double weight) {
  check_weight("Metrics::add_mean", name, weight);
  Accumulator& a = slot(name, MetricKind::kMean);
  a.sum += value * weight;
  a.weight += weight;
  a.count += 1;
}

void Metrics::add_count(const std::string& name, int64_t n) {
  Accumulator& a = slot(name, MetricKind::kCount);
  a.count = static_cast<int64_t>(static_cast<uint64_t>(a.count) +
                                 static_cast<uint64_t>(n));
}

namespace {
ReducedMetrics::Entry make_entry(MetricKind kind, double sum, double weight,
                                 int64_t count) {
  ReducedMetrics::Entry e;
  e.kind = kind;
  e.count = count;
  switch (kind) {
    case MetricKind::kSum: e.value = sum; break;
    case MetricKind::kMean:
      e.weight = weight;
      e.value = weight == 0 ? std::numeric_limits<double>::quiet_NaN()
                            : sum / weight;
      break;
    case MetricKind::kCount: e.value = static_cast<double>(count); break;
  }
  return e;
}
}  // namespace

ReducedMetrics Metrics::local() const {
  ReducedMetrics r;
  for (const auto& [name, a] : metrics_) {
    r.entries_[name] = make_entry(a.kind, a.sum, a.weight, a.count);
  }
  return r;
}

// Equal values on every rank <=> sum(v^2) * W == sum(v)^2 (the equality case
// of Cauchy-Schwarz). Both sums are exact in doubles for v < 2^16, W < 2^21.
bool all_equal(double sum, double sum_sq, int world) {
  using u128 = unsigned __int128;
  return static_cast<u128>(sum_sq) * static_cast<u128>(world) ==
         static_cast<u128>(sum) * static_cast<u128>(sum);
}

namespace {

using Layout = std::vector<std::pair<std::string, MetricKind>>;

// "<length>:<name><kind digit>" per metric: names may hold any byte.
std::string encode_layout(const Layout& layout) {
  std::string out;
  for (const auto& [name, kind] : layout) {
    out += std::to_string(name.size()) + ":" + name + static_cast<char>('0' + static_cast<int>(kind));
  }
  return out;
}

Layout decode_layout(const std::string& text) {
  Layout out;
  size_t at = 0;
  while (at < text.size()) {
    size_t colon = text.find(':', at);
    size_t len = std::stoul(text.substr(at, colon - at));
    out.emplace_back(text.substr(colon + 1, len),
                     static_cast<MetricKind>(text[colon + 1 + len] - '0'));
    at = colon + 2 + len;
  }
  return out;
}

}  // namespace

// Note [Metrics layout check]: a first fixed-size all_reduce checks that the
// ranks that added metrics added the same ones (count and 16-bit hash, each
// with its square: equal values on every such rank <=> sum(v^2) * m ==
// sum(v)^2), and counts the ranks that added none. Those (an empty shard)
// learn the names from the others (an all_gather of the layout, only then)
// and contribute zeros. Ranks with different tensors in one all_reduce
// would otherwise crash Gloo.
ReducedMetrics Metrics::all_reduce(const CollectiveOptions& options) const {
  const detail::CallScope call("Metrics::all_reduce", kMetricsAdvice);
  Layout layout;
  for (const auto& [name, a] : metrics_) layout.emplace_back(name, a.kind);
  if (layout.size() >= (1u << 16)) {
    throw InvalidArgument("Metrics::all_reduce: " + std::to_string(layout.size()) +
                          " metrics; at most 65535 are supported");
  }
  const bool empty = layout.empty();
  const double n = static_cast<double>(layout.size());
  const double h = empty ? 0.0 : layout_hash(layout);
  std::vector<double> check{n, n * n, h, h * h, empty ? 1.0 : 0.0};
  const int world = group_size(options);
  all_reduce_doubles(check, options);
  const int with_metrics = world - static_cast<int>(check[4]);
  if (with_metrics == 0) return ReducedMetrics();
  if (!all_equal(check[0], check[1], with_metrics) ||
      !all_equal(check[2], check[3], with_metrics)) {
    std::string names;
    for (const auto& [name, kind] : layout) {
      names += (names.empty() ? "" : ", ") + name + ":" + ddp::to_string(kind);
    }
    throw MismatchError(
        "Metrics::all_reduce: the ranks added different metric names or kinds; "
        "this rank has {" + names + "}. Add every metric on every rank (a "
        "rank that adds nothing at all contributes zeros to every metric)");
  }
  if (with_metrics < world) {
    for (const std::string& other : all_gather_string(encode_layout(layout), options)) {
      if (empty && !other.empty()) {
        layout = decode_layout(other);
        break;
      }
    }
  }
  std::vector<double> slots;
  for (const auto& [name, kind] : layout) {
    auto it = metrics_.find(name);
    const Accumulator zero{};
    const Accumulator& a = it == metrics_.end() ? zero : it->second;
    slots.push_back(a.sum);
    slots.push_back(a.weight);
    push_int64(slots, a.count);
  }
  all_reduce_doubles(slots, options);
  ReducedMetrics r;
  for (size_t i = 0; i < layout.size(); ++i) {
    const double* s = &slots[4 * i];
    r.entries_[layout[i].first] = make_entry(layout[i].second, s[0], s[1], pop_int64(s + 2));
  }
  return r;
}

}  // namespace ddp
