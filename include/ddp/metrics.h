// Metrics reduced across ranks: sums, means, sample-weighted means and exact
// counts.
//
// Each rank sees its own shard of the data, so a rank's loss or accuracy is
// not the job's. PyTorch programs all_reduce a tensor of partial sums and
// divide by the total sample count (as torchmetrics does); this file packages
// that: one all_reduce per call (Metrics::all_reduce adds a small check).
//
//   ddp::Metrics m;                           // one per epoch (or reset())
//   for (auto& batch : loader) {
//     ...
//     m.add_mean("loss", loss.item<double>(), batch_size);  // weighted
//     m.add_count("correct", n_correct);
//     m.add_count("samples", batch_size);
//   }
//   ddp::ReducedMetrics r = m.all_reduce();   // collective
//   ddp::print0f("loss %.4f acc %.4f", r.value("loss"),
//                double(r.count("correct")) / r.count("samples"));
//
// Collectives: every function or method documented as "collective" must be
// called by every rank of the group, in the same order as the group's other
// collectives (as any all_reduce); a rank that skips it makes the others
// wait until the group's timeout (TimeoutError). Each returns the same value
// on every rank: Gloo and NCCL give every rank the identical reduced bytes.
//
// Exactness: int64 counts are exact for any total that fits in int64 (they
// travel as two 32-bit halves in double slots, exact for up to 2^21 ranks).
// Sums are in double, added in the backend's order (not bit-reproducible
// across world sizes, as in PyTorch).
//
// Errors (collective functions): as all_reduce (collectives.h):
// InvalidArgument without a process group, TimeoutError, CommError.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ddp/collectives.h"

namespace ddp {

// --- single values: one all_reduce each -------------------------------------

// Collective. Sum of `value` over the ranks of the group.
double all_reduce_sum(double value, const CollectiveOptions& options = {});

// Collective. Unweighted mean over ranks: sum of `value` / world size. Use
// all_reduce_weighted_mean when ranks saw different numbers of samples.
double all_reduce_mean(double value, const CollectiveOptions& options = {});

// Collective. Sample-weighted mean: (sum over ranks of value_sum) / (sum over
// ranks of weight). `value_sum` is this rank's sum of per-sample values (e.g.
// mean batch loss * batch size, accumulated), `weight` its sample count (or
// any non-negative weight). Returns NaN when the total weight is 0.
// Throws InvalidArgument (before communicating) when weight < 0 or is NaN.
double all_reduce_weighted_mean(double value_sum, double weight,
                            const CollectiveOptions& options = {});

// Collective. Exact sum of `count` over ranks (int64, wraps on overflow as
// two's complement).
int64_t all_reduce_count(int64_t count, const CollectiveOptions& options = {});

// --- several metrics: one all_reduce for all values -------------------------

enum class MetricKind {
  kSum,    // sum of the added values over ranks (double)
  kMean,   // sample-weighted mean: sum(value * weight) / sum(weight)
  kCount,  // exact int64 sum
};

// The result of Metrics::all_reduce(): the same on every rank.
class ReducedMetrics {
 public:
  struct Entry {
    MetricKind kind = MetricKind::kSum;
    // kSum: the sum; kMean: the weighted mean (NaN when weight is 0);
    // kCount: the count, converted to double.
    double value = 0;
    double weight = 0;  // kMean: the total weight; otherwise 0
    // kCount: the exact total; kSum and kMean: the number of add_* calls
    // over all ranks.
    int64_t count = 0;
  };

  // Throws InvalidArgument naming `name` and the known names when `name` was
  // not added.
  const Entry& at(const std::string& name) const;
  // at(name).value.
  double value(const std::string& name) const;
  // at(name).count (for kCount metrics, the exact total).
  int64_t count(const std::string& name) const;
  bool contains(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }

  // "name=value" pairs sorted by name, separated by spaces; kMean and kSum
  // with %.6g, kCount as an integer ("acc=0.9134 loss=0.2412 samples=60000").
  std::string to_string() const;

 private:
  friend class Metrics;
  std::map<std::string, Entry> entries_;
};

// Accumulates named metrics on one rank and reduces them across ranks in a
// single all_reduce of values (after a 4-value layout check). Names are kept
// sorted, so ranks may add them in any order, but every rank that added
// metrics must have added the same names with the same kinds before
// reduce(). A rank that added nothing at all (an empty shard) contributes
// zeros to every metric the others added. A name keeps the kind it was first
// added with; adding it with another kind throws InvalidArgument naming both.
// Not thread-safe: one Metrics per thread, or lock around it.
class Metrics {
 public:
  // kSum: adds `value`.
  void add_sum(const std::string& name, double value);
  // kMean: adds `value` with `weight` (default: one sample). For a batch
  // mean, pass the batch mean and the batch size.
  // Throws InvalidArgument when weight < 0 or NaN.
  void add_mean(const std::string& name, double value, double weight = 1.0);
  // kCount: adds `n` exactly.
  void add_count(const std::string& name, int64_t n);

  // This rank's own values, not reduced (no communication).
  ReducedMetrics local() const;

  // Collective. Reduces every metric over the group: one all_reduce of 5
  // doubles that checks the ranks agree on the metrics (their number, and a
  // 16-bit hash of names and kinds) and counts the ranks that added none
  // (only then, an all_gather of the names, for those ranks), then one
  // all_reduce of 4 doubles per metric with all the values. Does not change
  // the local accumulation (call reset() for the next epoch).
  // Throws MismatchError on every rank when the ranks' metrics differ (a
  // difference in names or kinds escapes the hash with probability 2^-16),
  // InvalidArgument for 65536 metrics or more, errors of all_reduce
  // otherwise.
  ReducedMetrics all_reduce(const CollectiveOptions& options = {}) const;

  void reset() { metrics_.clear(); }
  bool empty() const { return metrics_.empty(); }

 private:
  struct Accumulator {
    MetricKind kind = MetricKind::kSum;
    double sum = 0;       // kSum: values; kMean: value * weight
    double weight = 0;    // kMean: weights
    int64_t count = 0;    // kCount: the total; others: add calls
  };
  Accumulator& slot(const std::string& name, MetricKind kind);
  std::map<std::string, Accumulator> metrics_;
};

const char* to_string(MetricKind kind);

}  // namespace ddp
