// BatchLoader: the same batches as a sequential loop with 0, 1 and 3
// workers (synthetic fetch and the real Fashion-MNIST test split), the
// prefetch window bound, drop_last, errors rethrown in order, timeouts,
// option errors, and destruction mid-epoch (bounded: a hang fails the test).
#include "ddp/datasets/batch_loader.h"

#include <ATen/ops/rand.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <stdexcept>

#include "ddp/datasets/fashion_mnist.h"
#include "ddp/datasets/seeding.h"
#include "ddp/error.h"

namespace ddp {
namespace datasets {
namespace {

// data = the indices as float, target = 2 * indices.
Batch echo(c10::ArrayRef<int64_t> idx) {
  std::vector<int64_t> v(idx.begin(), idx.end());
  at::Tensor t = at::tensor(v, at::kLong);
  return {t.to(at::kFloat), t * 2};
}

std::vector<int64_t> shuffled(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (i * 37 + 11) % n;  // 37 is coprime to the n used
  return v;
}

std::vector<Batch> drain(BatchLoader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

// Runs `f` on another thread; if it has not finished after `seconds`, the
// test process is ended (a hang must not stall the suite).
void bounded(double seconds, const std::function<void()>& f) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  std::thread([f, done] {
    f();
    done->set_value();
  }).detach();
  if (fut.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "bounded: did not finish within %.0f s (hang)\n", seconds);
    std::abort();
  }
  fut.get();
}

class BatchLoaderWorkers : public ::testing::TestWithParam<int> {};

TEST_P(BatchLoaderWorkers, SameBatchesAsSequential) {
  const auto indices = shuffled(1000);
  for (bool drop_last : {false, true}) {
    BatchLoaderOptions o;
    o.batch_size = 64;  // 15 full batches and one of 40
    o.workers = GetParam();
    o.drop_last = drop_last;
    BatchLoader loader(echo, indices, o);
    EXPECT_EQ(loader.num_batches(), drop_last ? 15 : 16);
    std::vector<Batch> got = drain(loader);
    ASSERT_EQ(got.size(), drop_last ? 15u : 16u);
    for (size_t k = 0; k < got.size(); ++k) {
      const int64_t begin = static_cast<int64_t>(k) * 64;
      const int64_t end = std::min<int64_t>(begin + 64, 1000);
      Batch want = echo(c10::ArrayRef<int64_t>(indices.data() + begin, end - begin));
      EXPECT_TRUE(got[k].data.equal(want.data)) << "batch " << k;
      EXPECT_TRUE(got[k].target.equal(want.target)) << "batch " << k;
    }
    EXPECT_FALSE(loader.next().has_value());  // stays exhausted
  }
}

TEST_P(BatchLoaderWorkers, FashionMnistSameAsGetBatch) {
  FashionMnistOptions fo;
  fo.train = false;
  FashionMnist test(fo);
  const auto indices = shuffled(test.size());
  BatchLoaderOptions o;
  o.batch_size = 256;
  o.workers = GetParam();
  BatchLoader loader = make_batch_loader(test, indices, o);
  int64_t k = 0;
  while (auto b = loader.next()) {
    const int64_t begin = k * 256;
    const int64_t n = std::min<int64_t>(256, test.size() - begin);
    Batch want = test.get_batch(c10::ArrayRef<int64_t>(indices.data() + begin, n));
    EXPECT_TRUE(b->data.equal(want.data)) << "batch " << k;
    EXPECT_TRUE(b->target.equal(want.target)) << "batch " << k;
    ++k;
  }
  EXPECT_EQ(k, 40);  // ceil(10000 / 256)
}

TEST_P(BatchLoaderWorkers, ErrorsAreRethrownInOrder) {
  BatchLoaderOptions o;
  o.batch_size = 10;
  o.workers = GetParam();
  std::vector<int64_t> seq(50);
  for (int i = 0; i < 50; ++i) seq[i] = i;
  BatchLoader loader(
      [](c10::ArrayRef<int64_t> idx) {
        if (idx[0] == 20) throw InvalidArgument("bad batch at 20");
        return echo(idx);
      },
      seq, o);
  EXPECT_EQ(loader.next()->target[0].item<int64_t>(), 0);
  EXPECT_EQ(loader.next()->target[0].item<int64_t>(), 20);
  try {
    loader.next();
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "bad batch at 20");
  }
  EXPECT_EQ(loader.next()->target[0].item<int64_t>(), 60);
  EXPECT_EQ(loader.next()->target[0].item<int64_t>(), 80);
  EXPECT_FALSE(loader.next().has_value());
}

INSTANTIATE_TEST_SUITE_P(Workers, BatchLoaderWorkers, ::testing::Values(0, 1, 3));

// A fetch with augmentation noise drawn from the batch's generator.
Batch noisy(c10::ArrayRef<int64_t> idx, at::Generator& g) {
  Batch b = echo(idx);
  b.data = b.data + at::rand({static_cast<int64_t>(idx.size())}, g);
  return b;
}

std::vector<at::Tensor> noise_of(int workers, int64_t epoch, int rank, uint64_t seed = 5,
                                 int64_t first_batch = 0) {
  BatchLoaderOptions o;
  o.batch_size = 4;
  o.workers = workers;
  o.seed = seed;
  o.epoch = epoch;
  o.rank = rank;
  o.first_batch = first_batch;
  std::vector<int64_t> indices = shuffled(41);
  indices.erase(indices.begin(), indices.begin() + first_batch * o.batch_size);
  BatchLoader loader(noisy, indices, o);
  std::vector<at::Tensor> out;
  for (const Batch& b : drain(loader)) out.push_back(b.data - b.target.to(at::kFloat) / 2);
  return out;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equal(b[i])) return false;
  }
  return true;
}

TEST(BatchLoaderTest, AugmentationRandomnessIsPerRankEpochAndBatchWhateverTheWorkers) {
  const auto base = noise_of(0, 3, 1);
  ASSERT_EQ(base.size(), 11u);
  EXPECT_TRUE(same(base, noise_of(1, 3, 1)));  // any number of workers:
  EXPECT_TRUE(same(base, noise_of(3, 3, 1)));  //   the same numbers
  EXPECT_TRUE(same(base, noise_of(0, 3, 1)));  // reproducible
  EXPECT_FALSE(same(base, noise_of(0, 3, 0)));  // another rank
  EXPECT_FALSE(same(base, noise_of(0, 4, 1)));  // another epoch
  EXPECT_FALSE(same(base, noise_of(0, 3, 1, 6)));  // another seed
  EXPECT_FALSE(base[0].equal(base[1]));  // each batch its own stream
  // What is left of an epoch (a resume after 7 batches) draws what those
  // batches drew in the whole epoch.
  const auto rest = noise_of(2, 3, 1, 5, 7);
  ASSERT_EQ(rest.size(), 4u);
  EXPECT_TRUE(same(rest, {base.begin() + 7, base.end()}));
  // The generator is data_generator(seed, epoch, rank, batch).
  at::Generator g = data_generator(5, 3, 1, 0);
  // (noise = (index + r) - index: r within float rounding)
  EXPECT_TRUE(base[0].allclose(at::rand({4}, g), 0, 1e-5));
}

TEST(BatchLoaderTest, PrefetchWindowIsBounded) {
  // With 3 workers and prefetch_factor 2, batch k is only fetched once
  // next() has returned batch k - 6 or later.
  std::atomic<int64_t> taken{0};
  std::atomic<int64_t> violations{0};
  BatchLoaderOptions o;
  o.batch_size = 1;
  o.workers = 3;
  o.prefetch_factor = 2;
  std::vector<int64_t> seq(200);
  for (int i = 0; i < 200; ++i) seq[i] = i;
  BatchLoader window(
      [&](c10::ArrayRef<int64_t> idx) {
        if (idx[0] > taken.load() + 6) ++violations;
        return echo(idx);
      },
      seq, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let workers run ahead
  while (auto b = window.next()) {
    ++taken;
    EXPECT_EQ(b->target[0].item<int64_t>(), 2 * (taken.load() - 1));
  }
  EXPECT_EQ(taken.load(), 200);
  EXPECT_EQ(violations.load(), 0);
}

TEST(BatchLoaderTest, DestroyedMidEpochDoesNotHang) {
  std::atomic<int> calls{0};
  bounded(60, [&] {
    std::vector<int64_t> idx(100000);
    for (int i = 0; i < 100000; ++i) idx[i] = i;
    BatchLoaderOptions o;
    o.batch_size = 10;
    o.workers = 3;
    BatchLoader loader(
        [&](c10::ArrayRef<int64_t> i) {
          ++calls;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return echo(i);
        },
        idx, o);
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
  });  // 9998 batches left unfetched
  // The 2 batches taken and at most the 6 (3 workers x 2) of the window.
  EXPECT_LE(calls.load(), 8);
  // And a loader destroyed before its first next().
  bounded(60, [] {
    BatchLoaderOptions o;
    o.workers = 3;
    BatchLoader loader(echo, std::vector<int64_t>(1000, 0), o);
  });
}

TEST(BatchLoaderTest, TimeoutWhenAFetchIsStuck) {
  BatchLoaderOptions o;
  o.workers = 1;
  o.timeout_s = 0.2;
  bounded(60, [&] {
    BatchLoader loader(
        [](c10::ArrayRef<int64_t> i) {
          std::this_thread::sleep_for(std::chrono::seconds(1));
          return echo(i);
        },
        std::vector<int64_t>{1, 2}, o);
    try {
      loader.next();
      ADD_FAILURE() << "no timeout";
    } catch (const TimeoutError& e) {
      EXPECT_STREQ(e.what(),
                   "BatchLoader: batch 0 of 2 not ready after 0.2 s (BatchLoaderOptions::timeout_s) "
                   "with 1 workers; a fetch is stuck or slower than the timeout");
    }
  });
}

TEST(BatchLoaderTest, EmptyIndexListAndBadOptions) {
  BatchLoaderOptions o;
  o.workers = 2;
  BatchLoader empty(echo, {}, o);
  EXPECT_EQ(empty.num_batches(), 0);
  EXPECT_FALSE(empty.next().has_value());
  auto error = [](BatchLoaderOptions bad) -> std::string {
    try {
      BatchLoader l(echo, {1}, bad);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  BatchLoaderOptions b;
  b.batch_size = 0;
  EXPECT_EQ(error(b), "BatchLoaderOptions::batch_size must be > 0, got 0");
  b = {};
  b.workers = -1;
  EXPECT_EQ(error(b), "BatchLoaderOptions::workers must be >= 0 (0 loads in the calling thread), got -1");
  b = {};
  b.prefetch_factor = 0;
  EXPECT_EQ(error(b), "BatchLoaderOptions::prefetch_factor must be >= 1, got 0");
  b = {};
  b.timeout_s = 0;
  EXPECT_EQ(error(b), "BatchLoaderOptions::timeout_s must be > 0 seconds, got 0");
  b = {};
  b.first_batch = -1;
  EXPECT_EQ(error(b), "BatchLoaderOptions::first_batch must be >= 0, got -1");
  EXPECT_THROW(BatchLoader(BatchFetch(), {1}, BatchLoaderOptions{}), InvalidArgument);
}

}  // namespace
}  // namespace datasets
}  // namespace ddp
