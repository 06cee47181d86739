// Fashion-MNIST: locate, read and check the split's two IDX files; gather
// and normalise batches. See fashion_mnist.h.
#include "ddp/datasets/fashion_mnist.h"

#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <type_traits>

#include "ddp/datasets/idx.h"
#include "ddp/error.h"

namespace ddp {
namespace datasets {
namespace {

constexpr int64_t kPixels = FashionMnist::kRows * FashionMnist::kCols;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string strip_slash(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// `<dir>/<base>.gz`, else the unpacked `<dir>/<base>`, else an error that
// says how to get the files.
std::string locate(const std::string& dir, const std::string& base) {
  const std::string gz = dir + "/" + base + ".gz";
  if (is_file(gz)) return gz;
  if (is_file(dir + "/" + base)) return dir + "/" + base;
  std::string way_out =
      dir == strip_slash(kFashionMnistDefaultDir)
          ? "Fashion-MNIST comes in Debian's package dataset-fashion-mnist; "
            "install it with: apt-get install dataset-fashion-mnist"
          : fmt::format("point --data-dir (FashionMnistOptions::data_dir) at the directory holding "
                        "the Fashion-MNIST files, or install Debian's dataset-fashion-mnist and use "
                        "the default {}",
                        kFashionMnistDefaultDir);
  throw InvalidArgument(fmt::format("{}: no such file (nor an unpacked {}); {}", gz, base, way_out));
}

at::Tensor read_images(const std::string& path) {
  IdxOptions o;
  o.expected_magic = idx_magic(IdxDtype::kUInt8, 3);
  IdxArray a = read_idx_file(path, o);
  if (a.dims[1] != FashionMnist::kRows || a.dims[2] != FashionMnist::kCols) {
    throw InvalidArgument(fmt::format(
        "{}: wrong image size: images are {}x{}, expected {}x{}; this is not Fashion-MNIST", path,
        a.dims[1], a.dims[2], FashionMnist::kRows, FashionMnist::kCols));
  }
  return a.tensor;
}

at::Tensor read_labels(const std::string& path) {
  IdxOptions o;
  o.expected_magic = idx_magic(IdxDtype::kUInt8, 1);
  IdxArray a = read_idx_file(path, o);
  const auto* p = a.tensor.data_ptr<uint8_t>();
  const int64_t n = a.tensor.numel();
  at::Tensor labels = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  auto* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= FashionMnist::kNumClasses) {
      throw InvalidArgument(fmt::format("{}: label {} at index {} is outside 0..{}; the file is corrupt",
                                        path, p[i], i, FashionMnist::kNumClasses - 1));
    }
    out[i] = p[i];
  }
  return labels;
}

}  // namespace

FashionMnist::FashionMnist(const FashionMnistOptions& options) : options_(options) {
  if (!(options.std > 0)) {
    throw InvalidArgument(fmt::format("FashionMnistOptions::std must be > 0, got {}", options.std));
  }
  const std::string dir = strip_slash(options.data_dir.empty() ? "." : options.data_dir);
  const std::string prefix = options.train ? "train" : "t10k";
  // Locate both before reading either: a missing file is reported at once.
  images_path_ = locate(dir, prefix + "-images-idx3-ubyte");
  labels_path_ = locate(dir, prefix + "-labels-idx1-ubyte");
  images_ = read_images(images_path_);
  labels_ = read_labels(labels_path_);
  if (images_.size(0) != labels_.size(0)) {
    throw InvalidArgument(fmt::format(
        "{} has {} images but {} has {} labels; the two files must come from the same split",
        images_path_, images_.size(0), labels_path_, labels_.size(0)));
  }
  // Float32 arithmetic in torchvision's order: ToTensor divides by 255,
  // Normalize subtracts the mean and divides by the std.
  for (int p = 0; p < 256; ++p) {
    float x = static_cast<float>(p) / 255.0f;
    table_[p] = (x - options.mean) / options.std;
  }
}

template <typename Index>
Batch FashionMnist::gather(c10::ArrayRef<Index> indices) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    const Index i = indices[k];
    const bool negative = std::is_signed<Index>::value && static_cast<int64_t>(i) < 0;
    if (negative || static_cast<uint64_t>(i) >= static_cast<uint64_t>(size())) {
      throw InvalidArgument(fmt::format("FashionMnist ({}): index {} (position {} in the batch) is out "
                                        "of range [0, {})",
                                        options_.train ? "train" : "test", i, k, size()));
    }
  }
  Batch b;
  b.data = at::empty({n, 1, kRows, kCols}, at::TensorOptions().dtype(at::kFloat));
  b.target = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  const uint8_t* src = images_.data_ptr<uint8_t>();
  const int64_t* lab = labels_.data_ptr<int64_t>();
  float* dst = b.data.data_ptr<float>();
  int64_t* tgt = b.target.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    const auto i = static_cast<int64_t>(indices[k]);
    const uint8_t* img = src + i * kPixels;
    float* out = dst + k * kPixels;
    for (int64_t j = 0; j < kPixels; ++j) out[j] = table_[img[j]];
    tgt[k] = lab[i];
  }
  return b;
}

Batch FashionMnist::get_batch(c10::ArrayRef<int64_t> indices) const { return gather(indices); }

Batch FashionMnist::get_batch(c10::ArrayRef<size_t> indices) const { return gather(indices); }

Batch FashionMnist::get(int64_t index) const {
  Batch b = gather(c10::ArrayRef<int64_t>(index));
  return {b.data.select(0, 0), b.target.select(0, 0)};
}

}  // namespace datasets
}  // namespace ddp
