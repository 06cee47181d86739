// FashionMnist on Debian's real files: sizes, known labels, class histogram,
// pixels equal to Python's gzip+struct reading, normalisation equal to
// ToTensor+Normalize, the documented mean/std recomputed, concurrent
// get_batch. Errors: fashion_mnist_errors_test.cc.
#include "ddp/datasets/fashion_mnist.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include "ddp/error.h"
#include "test_files.h"

namespace ddp {
namespace datasets {
namespace {

class RealFashionMnist : public ::testing::Test {
 protected:
  // Loaded once for the suite: the training split takes about a second.
  static void SetUpTestSuite() {
    FashionMnistOptions o;
    train_ = new FashionMnist(o);
    o.train = false;
    test_ = new FashionMnist(o);
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
  }
  static FashionMnist* train_;
  static FashionMnist* test_;
};
FashionMnist* RealFashionMnist::train_ = nullptr;
FashionMnist* RealFashionMnist::test_ = nullptr;

std::vector<int64_t> label_counts(const at::Tensor& labels) {
  std::vector<int64_t> h(10, 0);
  const int64_t* p = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) ++h.at(p[i]);
  return h;
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

TEST_F(RealFashionMnist, SizesLabelsAndHistogram) {
  EXPECT_EQ(train_->size(), 60000);
  EXPECT_EQ(test_->size(), 10000);
  EXPECT_EQ(train_->images().sizes(), (std::vector<int64_t>{60000, 28, 28}));
  EXPECT_EQ(test_->images().sizes(), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(train_->images_path(), "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  EXPECT_EQ(test_->labels_path(), "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  // The first labels of each split (train: 9 = ankle boot, 0 = T-shirt/top).
  const int64_t* tr = train_->labels().data_ptr<int64_t>();
  const int64_t* te = test_->labels().data_ptr<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(tr, tr + 12), (std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9}));
  EXPECT_EQ(std::vector<int64_t>(te, te + 12), (std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5}));
  EXPECT_EQ(label_counts(train_->labels()), std::vector<int64_t>(10, 6000));
  EXPECT_EQ(label_counts(test_->labels()), std::vector<int64_t>(10, 1000));
}

TEST_F(RealFashionMnist, PixelsEqualPythonsReading) {
  // Python reads the same .gz files with gzip + struct (no torch).
  const std::string out = testing::run_python(R"(
import gzip, struct
d = '/usr/share/datasets/fashion-mnist/'
for split, idxs in (('train', [0, 1, 30000, 59999]), ('t10k', [0, 9999])):
    I = gzip.open(d + split + '-images-idx3-ubyte.gz').read()
    L = gzip.open(d + split + '-labels-idx1-ubyte.gz').read()
    magic, n, rows, cols = struct.unpack('>IIII', I[:16])
    assert (magic, rows, cols) == (0x803, 28, 28), (magic, rows, cols)
    for i in idxs:
        print(split, i, L[8 + i], I[16 + i * 784:16 + (i + 1) * 784].hex())
)");
  std::istringstream lines(out);
  std::string split, pixels;
  int64_t index = 0, label = 0;
  int checked = 0;
  while (lines >> split >> index >> label >> pixels) {
    const FashionMnist& ds = split == "train" ? *train_ : *test_;
    const uint8_t* img = ds.images().data_ptr<uint8_t>() + index * 784;
    EXPECT_EQ(hex(img, 784), pixels) << split << " image " << index;
    EXPECT_EQ(ds.labels()[index].item<int64_t>(), label) << split << " label " << index;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

TEST_F(RealFashionMnist, BatchesAreNormalisedLikeToTensorThenNormalize) {
  const std::vector<int64_t> idx = {59999, 0, 7, 7};
  Batch b = train_->get_batch(idx);
  ASSERT_EQ(b.data.sizes(), (std::vector<int64_t>{4, 1, 28, 28}));
  ASSERT_EQ(b.data.scalar_type(), at::kFloat);
  ASSERT_EQ(b.target.sizes(), (std::vector<int64_t>{4}));
  ASSERT_EQ(b.target.scalar_type(), at::kLong);
  for (size_t k = 0; k < idx.size(); ++k) {
    // torchvision: img.float().div(255), then tensor.sub_(mean).div_(std).
    at::Tensor want = train_->images()[idx[k]].to(at::kFloat).div(255).sub(0.2860f).div(0.3530f);
    EXPECT_TRUE(b.data[k][0].equal(want)) << "image " << idx[k];
    EXPECT_EQ(b.target[k].item<int64_t>(), train_->labels()[idx[k]].item<int64_t>());
  }
  // get(i) is get_batch({i})[0]; size_t indices give the same batch.
  Batch one = test_->get(9999);
  EXPECT_EQ(one.data.sizes(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(one.target.dim(), 0);
  EXPECT_TRUE(one.data.equal(test_->get_batch(std::vector<int64_t>{9999}).data[0]));
  Batch s = train_->get_batch(std::vector<size_t>{59999, 0, 7, 7});
  EXPECT_TRUE(s.data.equal(b.data));
  EXPECT_TRUE(s.target.equal(b.target));
  EXPECT_EQ(train_->get_batch(std::vector<int64_t>{}).data.sizes(), (std::vector<int64_t>{0, 1, 28, 28}));
}

TEST_F(RealFashionMnist, DocumentedMeanAndStdAreTheTrainingSplits) {
  std::vector<int64_t> count(256, 0);
  const uint8_t* p = train_->images().data_ptr<uint8_t>();
  for (int64_t i = 0; i < train_->images().numel(); ++i) ++count[p[i]];
  double n = 0, sum = 0, sq = 0;
  for (int v = 0; v < 256; ++v) {
    n += count[v];
    sum += count[v] * (v / 255.0);
    sq += count[v] * (v / 255.0) * (v / 255.0);
  }
  const double mean = sum / n;
  const double std = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.28604, 1e-5);
  EXPECT_NEAR(std, 0.35302, 1e-5);
  EXPECT_EQ(std::round(mean * 1e4) / 1e4, static_cast<double>(std::round(kFashionMnistMean * 1e4f)) / 1e4);
  EXPECT_EQ(std::round(std * 1e4) / 1e4, static_cast<double>(std::round(kFashionMnistStd * 1e4f)) / 1e4);
}

TEST_F(RealFashionMnist, ConcurrentGetBatchEqualsSequential) {
  std::vector<std::vector<int64_t>> lists(4);
  for (int t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < 2000; ++i) lists[t].push_back((i * 7919 + t * 104729) % 60000);
  }
  std::vector<Batch> seq, par(4);
  for (auto& l : lists) seq.push_back(train_->get_batch(l));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) par[t] = train_->get_batch(lists[t]);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_TRUE(par[t].data.equal(seq[t].data)) << t;
    EXPECT_TRUE(par[t].target.equal(seq[t].target)) << t;
  }
}

TEST_F(RealFashionMnist, IndexOutOfRange) {
  try {
    test_->get_batch(std::vector<int64_t>{0, 10000});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "FashionMnist (test): index 10000 (position 1 in the batch) is out of range [0, 10000)");
  }
  EXPECT_THROW(test_->get(-1), InvalidArgument);
  EXPECT_THROW(test_->get_batch(std::vector<size_t>{size_t(-1)}), InvalidArgument);
}

}  // namespace
}  // namespace datasets
}  // namespace ddp
