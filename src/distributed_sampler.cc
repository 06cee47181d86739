// DistributedSampler: PyTorch's index arithmetic (torch/utils/data/
// distributed.py, 1.13) over ATen's randperm with a private CPU generator.
#include "ddp/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randperm.h>
#include <fmt/format.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "ddp/error.h"
#include "ddp/process_group.h"

namespace ddp {
namespace {

void check_dataset_size(int64_t dataset_size) {
  if (dataset_size < 0) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: dataset_size must be >= 0, got {}; pass the "
        "dataset's size()",
        dataset_size));
  }
}

// Fills one absent option from the default group, naming the option if
// there is no group (PyTorch raises from dist.get_world_size() here too).
int64_t from_group(const char* field, bool want_rank) {
  try {
    return want_rank ? get_rank() : get_world_size();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: options.{} not given and there is no default "
        "process group to take it from; call ddp::init_process_group() first "
        "or pass num_replicas and rank explicitly ({})",
        field, e.what()));
  }
}

// The ordered list before striding: PyTorch's `indices` after shuffling,
// positions [0, dataset_size).
std::vector<int64_t> epoch_order(int64_t dataset_size, bool shuffle,
                                 int64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size));
  if (!shuffle) {
    for (int64_t i = 0; i < dataset_size; ++i) order[i] = i;
    return order;
  }
  // Python's g.manual_seed(seed + epoch) maps negative seeds modulo 2^64;
  // unsigned arithmetic does the same without signed overflow.
  const uint64_t generator_seed =
      static_cast<uint64_t>(seed) + static_cast<uint64_t>(epoch);
  at::Generator gen = at::detail::createCPUGenerator(generator_seed);
  at::Tensor perm = at::randperm(dataset_size, gen, at::kLong).contiguous();
  const int64_t* p = perm.data_ptr<int64_t>();
  std::copy(p, p + dataset_size, order.begin());
  return order;
}

}  // namespace

int64_t distributed_sampler_num_samples(int64_t dataset_size,
                                        int64_t num_replicas, bool drop_last) {
  check_dataset_size(dataset_size);
  if (num_replicas < 1) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: num_replicas must be >= 1, got {}; pass the "
        "world size",
        num_replicas));
  }
  // PyTorch: ceil((N - W) / W) with drop_last, which is floor(N / W) when
  // W does not divide N (and 0 when N < W); else ceil(N / W).
  if (drop_last && dataset_size % num_replicas != 0) {
    return dataset_size / num_replicas;
  }
  return (dataset_size + num_replicas - 1) / num_replicas;
}

DistributedSamplerOptions resolve_distributed_sampler_options(
    const DistributedSamplerOptions& options) {
  DistributedSamplerOptions out = options;
  if (!out.num_replicas) out.num_replicas = from_group("num_replicas", false);
  if (!out.rank) out.rank = from_group("rank", true);
  const int64_t world = *out.num_replicas;
  const int64_t rank = *out.rank;
  if (world < 1) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: num_replicas must be >= 1, got {}; pass the "
        "world size",
        world));
  }
  if (rank < 0 || rank >= world) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: invalid rank {}, rank should be in the interval "
        "[0, {}] for num_replicas={}; pass a rank below num_replicas",
        rank, world - 1, world));
  }
  return out;
}

std::vector<int64_t> distributed_sampler_indices(
    int64_t dataset_size, const DistributedSamplerOptions& options,
    int64_t epoch) {
  return distributed_sampler_indices_after(dataset_size, options, epoch, 0);
}

std::vector<int64_t> distributed_sampler_indices_after(
    int64_t dataset_size, const DistributedSamplerOptions& options,
    int64_t epoch, int64_t consumed) {
  const DistributedSamplerOptions o =
      resolve_distributed_sampler_options(options);
  check_dataset_size(dataset_size);
  if (consumed < 0 || (consumed > 0 && consumed >= dataset_size)) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler: consumed = {} is outside [0, dataset_size = {}): "
        "pass how many positions of the epoch's order were trained on (a "
        "finished epoch has nothing left: start the next one)",
        consumed, dataset_size));
  }
  const int64_t world = *o.num_replicas;
  const int64_t num_samples = distributed_sampler_num_samples(
      dataset_size - consumed, world, o.drop_last);
  const int64_t total_size = num_samples * world;
  const std::vector<int64_t> order =
      epoch_order(dataset_size, o.shuffle, o.seed, epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples));
  // Padding repeats the order from its start: position p holds
  // order[p % N]. With drop_last consumed + total_size <= N. N > 0
  // whenever total_size > 0.
  for (int64_t pos = consumed + *o.rank; pos < consumed + total_size;
       pos += world) {
    mine.push_back(order[static_cast<size_t>(pos % dataset_size)]);
  }
  return mine;
}

int64_t distributed_sampler_num_unique_samples(
    int64_t dataset_size, const DistributedSamplerOptions& options) {
  const DistributedSamplerOptions o =
      resolve_distributed_sampler_options(options);
  const int64_t world = *o.num_replicas;
  const int64_t rank = *o.rank;
  const int64_t num_samples =
      distributed_sampler_num_samples(dataset_size, world, o.drop_last);
  // Positions rank + k*W, k < num_samples, that are below N.
  const int64_t limit = std::min(dataset_size, num_samples * world);
  if (rank >= limit) return 0;
  return std::min(num_samples, (limit - rank + world - 1) / world);
}

DistributedSampler::DistributedSampler(int64_t dataset_size,
                                       DistributedSamplerOptions options)
    : options_(resolve_distributed_sampler_options(options)),
      dataset_size_(dataset_size),
      epoch_(std::make_shared<std::atomic<int64_t>>(0)) {
  check_dataset_size(dataset_size);
  recompute();
}

void DistributedSampler::set_epoch(int64_t epoch) { epoch_->store(epoch); }

int64_t DistributedSampler::epoch() const { return epoch_->load(); }

int64_t DistributedSampler::num_unique_samples() const {
  return distributed_sampler_num_unique_samples(dataset_size_, options_);
}

void DistributedSampler::recompute() {
  indices_epoch_ = epoch_->load();
  num_samples_ = distributed_sampler_num_samples(
      dataset_size_, *options_.num_replicas, options_.drop_last);
  indices_ = distributed_sampler_indices(dataset_size_, options_,
                                         indices_epoch_);
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  position_ = 0;
  bool changed = epoch_->load() != indices_epoch_;
  if (new_size) {
    if (*new_size > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
      throw InvalidArgument(fmt::format(
          "DistributedSampler::reset: new_size {} exceeds int64_t", *new_size));
    }
    const auto size = static_cast<int64_t>(*new_size);
    changed = changed || size != dataset_size_;
    dataset_size_ = size;
  }
  if (changed) recompute();
}

c10::optional<std::vector<size_t>> DistributedSampler::next(
    size_t batch_size) {
  if (batch_size == 0) {
    throw InvalidArgument(
        "DistributedSampler::next: batch_size must be >= 1, got 0; set "
        "DataLoaderOptions::batch_size");
  }
  if (position_ >= indices_.size()) return c10::nullopt;
  const size_t count = std::min(batch_size, indices_.size() - position_);
  std::vector<size_t> batch(indices_.begin() + position_,
                            indices_.begin() + position_ + count);
  position_ += count;
  return batch;
}

namespace {

// Archive keys. The options that decide the order are saved so that a
// checkpoint from a different run configuration is refused, not silently
// misapplied.
constexpr const char* kInt64Keys[] = {"dataset_size", "num_replicas", "seed",
                                      "epoch", "position"};
constexpr const char* kBoolKeys[] = {"shuffle", "drop_last"};

c10::IValue read_key(torch::serialize::InputArchive& archive,
                     const std::string& key) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler::load: key '{}' missing from the archive; load an "
        "archive written by DistributedSampler::save",
        key));
  }
  return value;
}

template <typename T>
void expect_same(const char* field, T saved, T current) {
  if (saved != current) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler::load: the archive has {}={} but this sampler has "
        "{}={}; construct the sampler with the checkpoint's settings",
        field, saved, field, current));
  }
}

}  // namespace

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const int64_t values[] = {dataset_size_, *options_.num_replicas,
                            options_.seed, epoch_->load(),
                            static_cast<int64_t>(position_)};
  for (size_t i = 0; i < std::size(kInt64Keys); ++i) {
    archive.write(kInt64Keys[i], c10::IValue(values[i]));
  }
  archive.write(kBoolKeys[0], c10::IValue(options_.shuffle));
  archive.write(kBoolKeys[1], c10::IValue(options_.drop_last));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  int64_t v[std::size(kInt64Keys)];
  for (size_t i = 0; i < std::size(kInt64Keys); ++i) {
    v[i] = read_key(archive, kInt64Keys[i]).toInt();
  }
  const bool shuffle = read_key(archive, kBoolKeys[0]).toBool();
  const bool drop_last = read_key(archive, kBoolKeys[1]).toBool();
  expect_same("dataset_size", v[0], dataset_size_);
  expect_same("num_replicas", v[1], *options_.num_replicas);
  expect_same("seed", v[2], options_.seed);
  expect_same("shuffle", shuffle, options_.shuffle);
  expect_same("drop_last", drop_last, options_.drop_last);
  if (v[4] < 0 || v[4] > num_samples_) {
    throw InvalidArgument(fmt::format(
        "DistributedSampler::load: position {} outside [0, {}] (num_samples); "
        "the archive is corrupt",
        v[4], num_samples_));
  }
  epoch_->store(v[3]);
  recompute();
  position_ = static_cast<size_t>(v[4]);
}

}  // namespace ddp
