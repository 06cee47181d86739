// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017: 70,000 28x28 grayscale images of
// 10 kinds of clothing), read from the four IDX files that Debian's package
// dataset-fashion-mnist installs in /usr/share/datasets/fashion-mnist:
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz   (60,000)
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz    (10,000)
// Unpacked copies (the same names without .gz) are used when the .gz file is
// absent. Follows torchvision.datasets.FashionMNIST(root, train=...) with
// transforms ToTensor() then Normalize((0.2860,), (0.3530,)).
//
// The whole split is loaded into memory at construction (uint8, 47 MB for the
// training split) and normalised per batch through a 256-entry table, so a
// batch costs one pass over its pixels and the object stays small.
//
// Thread safety: after construction a FashionMnist is immutable; every const
// member may be called concurrently from any number of threads (the batch
// loader and torch's data loader workers do). Copies are cheap and share the
// (read-only) pixel and label tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/datasets/batch.h"

namespace ddp {
namespace datasets {

// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// Mean and standard deviation of the 60,000 x 784 training pixels scaled to
// [0, 1] (0.28604 and 0.35302, population std, computed from the training
// split; the test suite recomputes them). These rounded values are the ones
// commonly used with Fashion-MNIST, as (0.1307, 0.3081) are for MNIST.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

struct FashionMnistOptions {
  // Directory holding the four files (the --data-dir flag of ddp-train).
  std::string data_dir = kFashionMnistDefaultDir;
  // The 60,000-image training split if true, else the 10,000-image test split
  // (torchvision's `train`).
  bool train = true;
  // A pixel p in 0..255 becomes (p / 255 - mean) / std, in float32 and in
  // that order, as torchvision's ToTensor() + Normalize((mean,), (std,)) do;
  // the result is bitwise equal. mean = 0, std = 1 gives plain p / 255.
  // std must be > 0.
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
};

class FashionMnist {
 public:
  static constexpr int64_t kRows = 28;
  static constexpr int64_t kCols = 28;
  static constexpr int64_t kNumClasses = 10;

  // Reads and checks the split's images and labels.
  // Throws ddp::InvalidArgument naming the file and what is wrong:
  //   - a missing file; for the default directory the message says
  //     "install it with: apt-get install dataset-fashion-mnist", otherwise
  //     it says to point --data-dir (data_dir) at the right directory;
  //   - any read_idx_file() error (corrupt gzip, truncated, bad magic number:
  //     images must be 0x00000803, labels 0x00000801);
  //   - images that are not 28x28 ("wrong image size");
  //   - an image count that differs from the label count;
  //   - a label outside 0..9 (naming the first one and its index);
  //   - std <= 0 (naming FashionMnistOptions::std).
  explicit FashionMnist(const FashionMnistOptions& options = {});

  // Number of examples: 60000 (train) or 10000 (test) for the real files.
  int64_t size() const { return labels_.size(0); }
  bool train() const { return options_.train; }
  const FashionMnistOptions& options() const { return options_; }

  // Example `index`: data float32 1 x 28 x 28 (normalised), target int64
  // 0-d (0..9). CPU tensors owned by the caller. Throws ddp::InvalidArgument
  // if index is not in [0, size()).
  Batch get(int64_t index) const;

  // The examples at `indices`, stacked in that order (repeats allowed):
  // data float32 N x 1 x 28 x 28, target int64 N; N = indices.size(), which
  // may be 0. New CPU tensors owned by the caller. Throws
  // ddp::InvalidArgument, before any work, if an index is out of range.
  // (A braced list is ambiguous between the two overloads: pass a vector.)
  Batch get_batch(c10::ArrayRef<int64_t> indices) const;
  Batch get_batch(c10::ArrayRef<size_t> indices) const;

  // The raw pixels, uint8 N x 28 x 28, and labels, int64 N, as read from
  // the files (shared, read-only: do not modify them).
  const at::Tensor& images() const { return images_; }
  const at::Tensor& labels() const { return labels_; }
  // The files that were read.
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }

 private:
  template <typename Index>
  Batch gather(c10::ArrayRef<Index> indices) const;

  FashionMnistOptions options_;
  std::string images_path_;
  std::string labels_path_;
  at::Tensor images_;
  at::Tensor labels_;
  std::array<float, 256> table_{};  // pixel value -> normalised float
};

}  // namespace datasets
}  // namespace ddp
