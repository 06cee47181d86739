// TorchBatchAdapter with libtorch's own data loader: every batch, with 0 and
// 2 loader workers, equals FashionMnist::get_batch for the sampler's indices.
// (This file includes torch/data: the suite's one expensive translation unit.)
#include "ddp/datasets/torch_adapter.h"

#include <gtest/gtest.h>
#include <torch/data/dataloader.h>
#include <torch/data/samplers/distributed.h>
#include <torch/data/samplers/sequential.h>

#include "ddp/datasets/fashion_mnist.h"
#include "ddp/error.h"

namespace ddp {
namespace datasets {
namespace {

FashionMnist test_split() {
  FashionMnistOptions o;
  o.train = false;
  return FashionMnist(o);
}

TEST(TorchAdapterTest, SequentialSamplerBatchesEqualGetBatch) {
  const FashionMnist ds = test_split();
  for (size_t workers : {0, 2}) {
    auto loader = torch::data::make_data_loader(
        TorchBatchAdapter<FashionMnist>(ds), torch::data::samplers::SequentialSampler(ds.size()),
        torch::data::DataLoaderOptions(3000).workers(workers).enforce_ordering(true));
    int64_t begin = 0;
    for (torch::data::Example<>& b : *loader) {
      const int64_t n = std::min<int64_t>(3000, ds.size() - begin);
      std::vector<int64_t> idx(n);
      for (int64_t i = 0; i < n; ++i) idx[i] = begin + i;
      Batch want = ds.get_batch(idx);
      ASSERT_EQ(b.data.sizes(), (std::vector<int64_t>{n, 1, 28, 28}));
      EXPECT_TRUE(b.data.equal(want.data)) << "workers " << workers << " batch at " << begin;
      EXPECT_TRUE(b.target.equal(want.target)) << "workers " << workers << " batch at " << begin;
      begin += n;
    }
    EXPECT_EQ(begin, 10000) << "workers " << workers;
  }
}

TEST(TorchAdapterTest, DistributedSamplerCoversTheSplitOnce) {
  const FashionMnist ds = test_split();
  std::vector<int64_t> seen(10, 0);
  for (size_t rank = 0; rank < 2; ++rank) {
    auto loader = torch::data::make_data_loader(
        TorchBatchAdapter<FashionMnist>(ds),
        torch::data::samplers::DistributedRandomSampler(ds.size(), 2, rank),
        torch::data::DataLoaderOptions(512));
    for (torch::data::Example<>& b : *loader) {
      for (int64_t i = 0; i < b.target.size(0); ++i) ++seen.at(b.target[i].item<int64_t>());
    }
  }
  // Two ranks of 5000 examples each: every example once, 1000 per class.
  EXPECT_EQ(seen, std::vector<int64_t>(10, 1000));
}

TEST(TorchAdapterTest, SizeAndErrors) {
  TorchBatchAdapter<FashionMnist> adapter(test_split());
  EXPECT_EQ(adapter.size().value(), 10000u);
  std::vector<size_t> bad = {10000};
  EXPECT_THROW(adapter.get_batch(bad), InvalidArgument);
}

}  // namespace
}  // namespace datasets
}  // namespace ddp
