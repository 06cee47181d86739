// DistributedSampler: each rank's share of a dataset's indices, the same
// indices as torch.utils.data.DistributedSampler (PyTorch 1.13, 2.13 and
// 2.14 alike: tests/distributed_sampler_test.cc compares with the Python of
// each build) for the same (dataset size, num_replicas, rank, shuffle,
// seed, epoch, drop_last).
//
// What PyTorch does, and so what this does, per epoch:
//   1. order = shuffle ? randperm(N) from a CPU generator seeded with
//      seed + epoch : [0, 1, ..., N-1];
//   2. num_samples = drop_last && N % W != 0 ? floor(N / W) : ceil(N / W),
//      total_size = num_samples * W;
//   3. drop_last: keep order[0, total_size); else pad order to total_size by
//      repeating it from the start as many times as needed (so N < W works:
//      position p holds order[p % N]);
//   4. rank r takes positions r, r + W, r + 2W, ... (strided, not blocks).
// libtorch's own torch::data::samplers::DistributedRandomSampler gives
// contiguous blocks and other permutations; do not mix the two.
//
// Use in a training loop (the pattern of PyTorch's DDP examples):
//
//   ddp::DistributedSampler sampler(dataset.size().value());  // rank, W from
//                                                              // the group
//   auto loader = torch::data::make_data_loader(
//       dataset, sampler,                        // no shuffling in the loader
//       torch::data::DataLoaderOptions().batch_size(per_process_batch));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);   // before iterating: new order every epoch
//     for (auto& batch : *loader) { ... }
//   }
//
// The global batch is per_process_batch * world_size; scale the learning rate
// for that, not for the per-process batch. Every rank must use the same seed
// (and the same epoch), or the ranks' shares overlap.
//
// Exact evaluation: with drop_last=false the last positions of the padded
// order repeat earlier samples, so summing per-rank metrics counts a few
// samples twice. Padding positions are global positions >= N, and a rank's
// padding always comes at the end of its list: count only the first
// num_unique_samples() samples of each rank and every sample is counted
// exactly once over all ranks (the unique counts sum to N).
#pragma once

#include <torch/data/samplers/base.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace ddp {

// PyTorch's constructor arguments, with PyTorch's defaults.
struct DistributedSamplerOptions {
  // Number of ranks sharing the dataset. Default: ddp::get_world_size() of
  // the calling thread's default group at construction.
  std::optional<int64_t> num_replicas;
  // This rank, in [0, num_replicas). Default: ddp::get_rank().
  std::optional<int64_t> rank;
  // Shuffle with randperm seeded by seed + epoch; false: 0..N-1 in order.
  bool shuffle = true;
  // Same on every rank. seed + epoch is taken modulo 2^64 as the generator's
  // seed (PyTorch accepts values in [-2^63, 2^64) and does the same).
  int64_t seed = 0;
  // true: drop the tail so every rank has floor(N / W) distinct samples;
  // false: pad with repeats so every rank has ceil(N / W).
  bool drop_last = false;
};

// Samples per rank, PyTorch's len(sampler). Throws InvalidArgument when
// dataset_size < 0 or num_replicas < 1.
int64_t distributed_sampler_num_samples(int64_t dataset_size,
                                        int64_t num_replicas, bool drop_last);

// The options with num_replicas and rank filled in from the default group
// where absent, validated. Throws InvalidArgument: num_replicas < 1; rank
// outside [0, num_replicas) (naming both); either absent and no default
// group exists (call ddp::init_process_group() or pass both).
DistributedSamplerOptions resolve_distributed_sampler_options(
    const DistributedSamplerOptions& options);

// Rank options.rank's indices into a dataset of dataset_size samples for one
// epoch, in the order PyTorch's sampler yields them: num_samples values in
// [0, dataset_size). Resolves and validates the options as above, and also
// throws InvalidArgument when dataset_size < 0. Costs one randperm of
// dataset_size (about 1 ms for 60,000) when shuffling. Thread-safe (uses its
// own generator, never the global one).
std::vector<int64_t> distributed_sampler_indices(
    int64_t dataset_size, const DistributedSamplerOptions& options,
    int64_t epoch);

// Mid-epoch resume, on the same or another world size: rank options.rank's
// indices for the rest of an epoch whose first `consumed` positions of the
// epoch's order (step 1 above) were trained on already. The remaining
// positions [consumed, N) are shared out as steps 2-4 share out [0, N):
// num_samples(N - consumed, W, drop_last) per rank, padding continuing at
// position N (order[p % N], so the padding repeats the epoch's first
// samples, as PyTorch's does), rank r taking consumed + r, consumed + r + W,
// ... With consumed = 0 this is distributed_sampler_indices. After k full
// batches of b samples on each of W ranks, consumed grows by k * b * W;
// when consumed is a multiple of W (any resume on the world size that
// consumed them) rank r's list equals the tail of its uninterrupted one.
// PyTorch's sampler has no such entry point (torchdata's stateful sampler
// resumes on the same world size only). Throws as distributed_sampler_indices,
// and InvalidArgument when consumed is outside [0, dataset_size).
std::vector<int64_t> distributed_sampler_indices_after(
    int64_t dataset_size, const DistributedSamplerOptions& options,
    int64_t epoch, int64_t consumed);

// How many of rank options.rank's num_samples are real samples rather than
// padding repeats (the first ones; the rest are padding). Equal to
// num_samples with drop_last or when W divides N; sums to dataset_size over
// the ranks otherwise. Independent of shuffle, seed and epoch. Throws as
// distributed_sampler_indices.
int64_t distributed_sampler_num_unique_samples(
    int64_t dataset_size, const DistributedSamplerOptions& options);

// The sampler for libtorch's data loaders: make_data_loader(dataset, sampler,
// options) with BatchRequestType std::vector<size_t>.
//
// The loader keeps its own copy of the sampler, out of reach. Copies share
// the epoch (one shared atomic), so sampler.set_epoch(e) on the user's copy
// reaches the loader's copy, which recomputes its indices at the loader's
// next begin() (begin() calls reset()). Each copy has its own index list and
// cursor. Like PyTorch, set_epoch only takes effect at the next reset(); an
// iteration in progress keeps its order.
//
// Thread safety: set_epoch() and epoch() may be called from any thread at
// any time. The other members are not synchronised: use one copy from one
// thread at a time (the data loader calls reset/next from its main thread).
class DistributedSampler
    : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // Indices for a dataset of dataset_size samples, ready to iterate at the
  // epoch 0 order. Resolves num_replicas and rank from the default group
  // where absent. Throws as distributed_sampler_indices.
  explicit DistributedSampler(int64_t dataset_size,
                              DistributedSamplerOptions options = {});

  // The epoch used from the next reset() on, in this copy and every copy
  // made from it (and from its copies). Seed of the order: seed + epoch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // Samples per epoch for this rank: PyTorch's len(sampler).
  int64_t size() const { return num_samples_; }
  // The first num_unique_samples() of this rank's indices are not padding;
  // see distributed_sampler_num_unique_samples and the file comment.
  int64_t num_unique_samples() const;
  int64_t dataset_size() const { return dataset_size_; }
  int64_t num_replicas() const { return *options_.num_replicas; }
  int64_t rank() const { return *options_.rank; }
  // The resolved options (num_replicas and rank always set).
  const DistributedSamplerOptions& options() const { return options_; }
  // This copy's indices for the epoch of its last reset() (or construction),
  // and its cursor into them (samples already handed out by next()).
  const std::vector<int64_t>& indices() const { return indices_; }
  size_t position() const { return position_; }

  // Rewinds to the start and recomputes the order if the epoch changed (or
  // new_size, a new dataset size, is given). Throws InvalidArgument if
  // new_size exceeds int64_t.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;

  // The next min(batch_size, remaining) indices; nullopt once the epoch's
  // num_samples are all handed out. Throws InvalidArgument if batch_size is
  // 0 (the loader would spin forever).
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;

  // Writes dataset_size, num_replicas, shuffle, seed, drop_last, epoch and
  // the cursor (not rank: any rank can restore rank 0's checkpoint, all
  // ranks having the same cursor).
  void save(torch::serialize::OutputArchive& archive) const override;
  // Restores the epoch (shared with the copies, as set_epoch) and the
  // cursor, recomputing this copy's indices. Throws InvalidArgument naming
  // the key if one is missing, or naming the field and both values if the
  // archive was written with different dataset_size, num_replicas, shuffle,
  // seed or drop_last. A data loader's begin() rewinds to the start anyway:
  // resuming mid-epoch needs a sampler used directly.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void recompute();

  DistributedSamplerOptions options_;
  int64_t dataset_size_ = 0;
  int64_t num_samples_ = 0;
  std::shared_ptr<std::atomic<int64_t>> epoch_;
  int64_t indices_epoch_ = 0;  // the epoch indices_ were computed for
  std::vector<int64_t> indices_;
  size_t position_ = 0;
};

}  // namespace ddp
