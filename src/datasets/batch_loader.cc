// Ordered prefetching of batches by worker threads. See batch_loader.h.
//
// Workers claim batch numbers in increasing order from one counter, but only
// while fewer than `capacity_` batches are claimed and not yet taken; results
// go to a map keyed by batch number, and next() waits for the one it needs.
// So the order is the sequential one and memory stays bounded.
#include "ddp/datasets/batch_loader.h"

#include <fmt/format.h>

#include <chrono>

#include "ddp/datasets/seeding.h"
#include "ddp/error.h"
#include "ddp/process_group.h"

namespace ddp {
namespace datasets {
namespace {

template <typename Fetch>
void check_options(const Fetch& fetch, const BatchLoaderOptions& o) {
  auto bad = [](const char* field, const std::string& want, const std::string& got) {
    throw InvalidArgument(fmt::format("BatchLoaderOptions::{} must be {}, got {}", field, want, got));
  };
  if (!fetch) throw InvalidArgument("BatchLoader: the fetch function is empty");
  if (o.batch_size <= 0) bad("batch_size", "> 0", std::to_string(o.batch_size));
  if (o.workers < 0) bad("workers", ">= 0 (0 loads in the calling thread)", std::to_string(o.workers));
  if (o.prefetch_factor < 1) bad("prefetch_factor", ">= 1", std::to_string(o.prefetch_factor));
  if (!(o.timeout_s > 0)) bad("timeout_s", "> 0 seconds", fmt::format("{}", o.timeout_s));
  if (o.first_batch < 0) bad("first_batch", ">= 0", std::to_string(o.first_batch));
}

BatchFetchRandom without_generator(BatchFetch fetch) {
  if (!fetch) throw InvalidArgument("BatchLoader: the fetch function is empty");
  return [fetch = std::move(fetch)](c10::ArrayRef<int64_t> i, at::Generator&) { return fetch(i); };
}

}  // namespace

BatchLoader::BatchLoader(BatchFetch fetch, std::vector<int64_t> indices, BatchLoaderOptions options)
    : BatchLoader(without_generator(std::move(fetch)), std::move(indices), options) {}

BatchLoader::BatchLoader(BatchFetchRandom fetch, std::vector<int64_t> indices,
                         BatchLoaderOptions options)
    : indices_(std::move(indices)), options_(options) {
  check_options(fetch, options_);
  if (options_.rank < 0) options_.rank = is_initialized() ? get_rank() : 0;
  fetch_ = [fetch = std::move(fetch), o = options_](c10::ArrayRef<int64_t> i, int64_t k) {
    at::Generator g = data_generator(o.seed, o.epoch, o.rank, o.first_batch + k);
    return fetch(i, g);
  };
  const auto n = static_cast<int64_t>(indices_.size());
  num_batches_ = options_.drop_last ? n / options_.batch_size
                                    : (n + options_.batch_size - 1) / options_.batch_size;
  capacity_ = int64_t{options_.workers} * options_.prefetch_factor;
  const int spawn = static_cast<int>(std::min<int64_t>(options_.workers, num_batches_));
  try {
    for (int w = 0; w < spawn; ++w) threads_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_and_join();  // the threads already started, before failing
    throw;
  }
}

BatchLoader::~BatchLoader() { stop_and_join(); }

void BatchLoader::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

BatchLoader::Result BatchLoader::make(int64_t k) {
  const int64_t begin = k * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, indices_.size());
  Result r;
  try {
    r.batch = fetch_(c10::ArrayRef<int64_t>(indices_.data() + begin, end - begin), k);
  } catch (...) {
    r.error = std::current_exception();
  }
  return r;
}

void BatchLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Waits for room in the window or for stop; no timeout: a consumer may
    // legitimately take long between batches, and the destructor wakes us.
    cv_.wait(lock, [&] {
      return stop_ || next_claim_ >= num_batches_ || next_claim_ < next_out_ + capacity_;
    });
    if (stop_ || next_claim_ >= num_batches_) return;
    const int64_t k = next_claim_++;
    lock.unlock();
    Result r = make(k);
    lock.lock();
    ready_.emplace(k, std::move(r));
    cv_.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  if (next_out_ >= num_batches_) return std::nullopt;
  Result r;
  if (threads_.empty()) {
    r = make(next_out_++);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t k = next_out_;
    const auto timeout = std::chrono::duration<double>(options_.timeout_s);
    if (!cv_.wait_for(lock, timeout, [&] { return ready_.count(k) != 0; })) {
      throw TimeoutError(fmt::format(
          "BatchLoader: batch {} of {} not ready after {} s (BatchLoaderOptions::timeout_s) with {} "
          "workers; a fetch is stuck or slower than the timeout",
          k, num_batches_, options_.timeout_s, threads_.size()));
    }
    auto it = ready_.find(k);
    r = std::move(it->second);
    ready_.erase(it);
    ++next_out_;
    lock.unlock();
    cv_.notify_all();  // room for one more batch in the window
  }
  if (r.error) std::rethrow_exception(r.error);
  return std::move(r.batch);
}

}  // namespace datasets
}  // namespace ddp
