// Use a ddp dataset (FashionMnist) with libtorch's data loader:
//
//   ddp::datasets::FashionMnist train;  // loads once
//   ddp::DistributedSampler sampler(train.size());  // distributed_sampler.h
//   auto loader = torch::data::make_data_loader(
//       ddp::datasets::TorchBatchAdapter<ddp::datasets::FashionMnist>(train), sampler,
//       torch::data::DataLoaderOptions(64).workers(2));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);  // reaches the loader's copy
//     for (torch::data::Example<>& batch : *loader) { batch.data; batch.target; }
//   }
//
// The adapter is a BatchDataset whose batches are already stacked Examples
// (data N x 1 x 28 x 28 float32, target N int64), so no Stack<> transform is
// needed, and each batch is made in one pass (no per-example tensors).
//
// Samplers: the adapter takes its indices from any libtorch sampler whose
// batch request is std::vector<size_t>; which samples a rank sees is the
// sampler's business alone. Train with ddp::DistributedSampler: PyTorch's
// indices, and set_epoch on your copy reaches the loader's copy.
// libtorch's torch::data::samplers::DistributedRandomSampler is fine where
// neither matters, e.g. one evaluation pass that must see every sample once
// (tests/datasets/torch_adapter_test.cc): its ranks' shares are disjoint
// too, but contiguous blocks of another permutation, and the loader's
// private copy never sees set_epoch, so every epoch repeats one order.
// Every rank must use the same kind of sampler, or the shares overlap.
//
// This header includes torch/data (which pulls in all of ATen, ~30 s per
// translation unit to compile); ddp's own code uses FashionMnist::get_batch
// or BatchLoader (batch_loader.h) instead and does not include it.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cstddef>
#include <utility>

namespace ddp {
namespace datasets {

// `Dataset` needs `Batch get_batch(c10::ArrayRef<size_t>) const` (with the
// fields data and target) and `int64_t size() const`. The adapter holds a
// copy of it: libtorch's loader copies the dataset into each worker, and a
// FashionMnist copy shares its tensors, so copies are cheap. Thread safety:
// as the wrapped dataset's (FashionMnist: safe from any number of threads).
template <typename Dataset>
class TorchBatchAdapter
    : public torch::data::datasets::BatchDataset<TorchBatchAdapter<Dataset>, torch::data::Example<>,
                                                 c10::ArrayRef<size_t>> {
 public:
  explicit TorchBatchAdapter(Dataset dataset) : dataset_(std::move(dataset)) {}

  // Throws what Dataset::get_batch throws (ddp::InvalidArgument for an
  // index out of range).
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override {
    auto b = dataset_.get_batch(indices);
    return {std::move(b.data), std::move(b.target)};
  }

  c10::optional<size_t> size() const override { return static_cast<size_t>(dataset_.size()); }

  const Dataset& dataset() const { return dataset_; }

 private:
  Dataset dataset_;
};

}  // namespace datasets
}  // namespace ddp
