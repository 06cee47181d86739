// Batches for one rank and one epoch, prefetched by worker threads: the
// part of torch.utils.data.DataLoader that ddp-train needs (--workers is
// DataLoader's num_workers, prefetch_factor its prefetch_factor).
//
// Given the indices this rank visits in this epoch (from a sampler, e.g.
// DistributedSampler) and a batch size, batch k holds
// indices[k * batch_size, min((k + 1) * batch_size, indices.size())); the
// last, shorter batch is dropped if drop_last (as DataLoader does). next()
// returns the batches in that order whatever the number of workers, so
// results are the same as a sequential loop: with `workers` = 0 each batch is
// made in the calling thread inside next(); with W > 0, W threads make them
// ahead of time, at most W * prefetch_factor batches made but not yet taken
// (bounding memory).
//
// Destroying a loader mid-epoch is fine: it stops the workers and joins
// them, waiting only for the fetch calls already running (one per worker).
//
// Thread safety: one thread uses a loader (next() is not reentrant); the
// fetch function is called from the workers concurrently, so it must be
// thread-safe (FashionMnist::get_batch is).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/util/ArrayRef.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ddp/datasets/batch.h"

namespace ddp {
namespace datasets {

struct BatchLoaderOptions {
  // Examples per batch; > 0.
  int64_t batch_size = 1;
  // Loader threads (DataLoader's num_workers); >= 0; 0 = no threads.
  int workers = 0;
  // Batches in flight per worker (DataLoader's prefetch_factor); >= 1.
  int prefetch_factor = 2;
  // Drop the last batch if it is shorter than batch_size.
  bool drop_last = false;
  // How long next() waits for a worker's batch, in seconds; > 0. Fetching a
  // batch from memory takes milliseconds: running out means a stuck fetch.
  double timeout_s = 300;
  // For a fetch that takes a generator (BatchFetchRandom): batch k gets
  // data_generator(seed, epoch, rank, k) (seeding.h), so augmentation is
  // reproducible, independent of `workers`, and differs across ranks and
  // epochs. rank -1: this process's rank in the default group (0 if none).
  uint64_t seed = 0;
  int64_t epoch = 0;
  int rank = -1;
  // The number of the loader's first batch in its epoch (>= 0): a loader
  // over what is left of a resumed epoch passes the batches already done,
  // so that every batch keeps its number, and so its draws.
  int64_t first_batch = 0;
};

// Makes the batch of the given dataset indices; called with each batch's
// slice of the index list, which stays valid during the call only.
using BatchFetch = std::function<Batch(c10::ArrayRef<int64_t> indices)>;
// The same, with the batch's own generator for random augmentation (see
// BatchLoaderOptions::seed and seeding.h). Use only that generator for the
// batch's randomness: the global one is shared by the worker threads.
using BatchFetchRandom =
    std::function<Batch(c10::ArrayRef<int64_t> indices, at::Generator& generator)>;

class BatchLoader {
 public:
  // Starts options.workers threads at once. Throws ddp::InvalidArgument for
  // an option out of range (naming the BatchLoaderOptions field) or an empty
  // fetch. Indices are not checked here: fetch checks them.
  BatchLoader(BatchFetch fetch, std::vector<int64_t> indices, BatchLoaderOptions options);
  BatchLoader(BatchFetchRandom fetch, std::vector<int64_t> indices, BatchLoaderOptions options);
  // Stops and joins the workers (see above); never throws.
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch in order, or nullopt after the last one. If fetch threw
  // for this batch, next() rethrows that exception (the batch is then
  // skipped; a later next() returns the following batch). Throws
  // ddp::TimeoutError if a worker has not delivered within timeout_s.
  std::optional<Batch> next();

  // Batches in the epoch: ceil(n / batch_size), or floor if drop_last.
  int64_t num_batches() const { return num_batches_; }

 private:
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };
  Result make(int64_t k);
  void worker_loop();
  void stop_and_join();

  // Both kinds of fetch, as a function of the batch's number.
  std::function<Batch(c10::ArrayRef<int64_t>, int64_t batch)> fetch_;
  std::vector<int64_t> indices_;
  BatchLoaderOptions options_;
  int64_t num_batches_ = 0;
  int64_t capacity_ = 0;  // workers * prefetch_factor

  std::mutex mu_;
  std::condition_variable cv_;  // any change to the state below
  std::map<int64_t, Result> ready_;
  int64_t next_claim_ = 0;  // next batch a worker takes
  int64_t next_out_ = 0;    // next batch next() returns
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// A loader over `dataset`'s get_batch(c10::ArrayRef<int64_t>) (FashionMnist
// or anything with that member). `dataset` is held by reference: it must
// outlive the loader.
template <typename Dataset>
BatchLoader make_batch_loader(const Dataset& dataset, std::vector<int64_t> indices,
                              BatchLoaderOptions options) {
  return BatchLoader([&dataset](c10::ArrayRef<int64_t> i) { return dataset.get_batch(i); },
                     std::move(indices), options);
}

}  // namespace datasets
}  // namespace ddp
