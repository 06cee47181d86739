// FashionMnist's errors, each with its message, from small crafted
// directories (missing file, count mismatch, label out of range, wrong image
// size, bad magic number, truncated and corrupt gzip, bad options), and the
// install hint when the default directory lacks the package.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "ddp/datasets/fashion_mnist.h"
#include "ddp/error.h"
#include "test_files.h"

namespace ddp {
namespace datasets {
namespace {

using testing::gzip;
using testing::idx_bytes;
using testing::write_file;

// The default directory without the package: run this binary again in a
// private mount namespace where a tmpfs hides /usr/share/datasets/fashion-mnist
// (needs root and unshare; skipped otherwise), and look at the message.
TEST(FashionMnistDefaultDir, MissingPackageSaysHowToInstall) {
  if (std::getenv("DDP_DATASETS_PROBE") != nullptr) {  // the child
    try {
      FashionMnist ds;
      std::printf("PROBE loaded %lld\n", static_cast<long long>(ds.size()));
    } catch (const InvalidArgument& e) {
      std::printf("PROBE %s\n", e.what());
    }
    return;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (geteuid() != 0 || n <= 0 || std::system("command -v unshare >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and unshare to hide the default directory";
  }
  self[n] = '\0';
  const std::string cmd = std::string("DDP_DATASETS_PROBE=1 timeout 60 unshare -m sh -c 'mount -t tmpfs none ") +
                          kFashionMnistDefaultDir + " && exec " + self +
                          " --gtest_filter=FashionMnistDefaultDir.MissingPackageSaysHowToInstall' 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
  pclose(p);
  if (out.find("PROBE") == std::string::npos) GTEST_SKIP() << "cannot mount in a namespace here: " << out;
  EXPECT_NE(out.find("PROBE /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz: no such file (nor "
                     "an unpacked train-images-idx3-ubyte); Fashion-MNIST comes in Debian's package "
                     "dataset-fashion-mnist; install it with: apt-get install dataset-fashion-mnist\n"),
            std::string::npos)
      << out;
}

// --- crafted directories ----------------------------------------------------

// 3 images 28x28 of one value each (0, 128, 255), labels 1, 0, 9.
std::string images(uint32_t n = 3, uint32_t rows = 28, uint32_t cols = 28) {
  std::string px;
  for (uint32_t i = 0; i < n; ++i) px += std::string(rows * cols, static_cast<char>(i == 0 ? 0 : i == 1 ? 128 : 255));
  return idx_bytes(0x0803, {n, rows, cols}, px);
}
std::string labels(const std::string& values = std::string("\1\0\11", 3)) {
  return idx_bytes(0x0801, {static_cast<uint32_t>(values.size())}, values);
}

class CraftedFashionMnist : public ::testing::Test {
 protected:
  // Writes the training files (gzip) and returns the error from loading
  // them ("" if none).
  std::string load_error(const std::string& img, const std::string& lab) {
    write_file(dir_.file("train-images-idx3-ubyte.gz"), img);
    write_file(dir_.file("train-labels-idx1-ubyte.gz"), lab);
    try {
      FashionMnistOptions o;
      o.data_dir = dir_.path();
      FashionMnist ds(o);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
  std::string img_path() const { return dir_.file("train-images-idx3-ubyte.gz"); }
  std::string lab_path() const { return dir_.file("train-labels-idx1-ubyte.gz"); }
  testing::TempDir dir_;
};

TEST_F(CraftedFashionMnist, ValidGzipAndUnpackedFiles) {
  ASSERT_EQ(load_error(gzip(images()), gzip(labels())), "");
  // Unpacked test-split files, with mean 0 / std 1: plain p / 255.
  write_file(dir_.file("t10k-images-idx3-ubyte"), images());
  write_file(dir_.file("t10k-labels-idx1-ubyte"), labels());
  FashionMnistOptions o;
  o.data_dir = dir_.path() + "/";
  o.train = false;
  o.mean = 0;
  o.std = 1;
  FashionMnist ds(o);
  EXPECT_EQ(ds.labels_path(), dir_.file("t10k-labels-idx1-ubyte"));
  Batch b = ds.get_batch(std::vector<int64_t>{2, 1, 0});
  EXPECT_EQ(b.target[0].item<int64_t>(), 9);
  EXPECT_EQ(b.target[2].item<int64_t>(), 1);
  EXPECT_EQ(b.data[0][0][5][5].item<float>(), 1.0f);
  EXPECT_EQ(b.data[1][0][27][0].item<float>(), 128.0f / 255.0f);
  EXPECT_EQ(b.data[2].abs().max().item<float>(), 0.0f);
}

TEST_F(CraftedFashionMnist, MissingFile) {
  write_file(dir_.file("train-images-idx3-ubyte.gz"), gzip(images()));
  FashionMnistOptions o;
  o.data_dir = dir_.path();
  try {
    FashionMnist ds(o);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              lab_path() + ": no such file (nor an unpacked train-labels-idx1-ubyte); point --data-dir "
              "(FashionMnistOptions::data_dir) at the directory holding the Fashion-MNIST files, or "
              "install Debian's dataset-fashion-mnist and use the default /usr/share/datasets/fashion-mnist");
  }
}

TEST_F(CraftedFashionMnist, CountMismatch) {
  EXPECT_EQ(load_error(gzip(images()), gzip(labels(std::string("\1\2", 2)))),
            img_path() + " has 3 images but " + lab_path() +
                " has 2 labels; the two files must come from the same split");
}

TEST_F(CraftedFashionMnist, LabelOutOfRange) {
  EXPECT_EQ(load_error(gzip(images()), gzip(labels(std::string("\1\12\3", 3)))),
            lab_path() + ": label 10 at index 1 is outside 0..9; the file is corrupt");
}

TEST_F(CraftedFashionMnist, WrongImageSize) {
  EXPECT_EQ(load_error(gzip(images(3, 28, 27)), gzip(labels())),
            img_path() + ": wrong image size: images are 28x27, expected 28x28; this is not Fashion-MNIST");
}

TEST_F(CraftedFashionMnist, BadMagicNumber) {
  // Images and labels swapped.
  EXPECT_EQ(load_error(gzip(labels()), gzip(images())),
            img_path() + ": bad magic number: expected 0x00000803 (uint8, 3 dimensions), got 0x00000801 "
                         "(uint8, 1 dimension); is this the right file?");
}

TEST_F(CraftedFashionMnist, TruncatedAndCorruptGzip) {
  // Noisy pixels, so that the compressed file is long and cutting it cuts
  // the pixels (a cut in a constant image's tiny stream would cut the header).
  std::string px(3 * 784, '\0');
  std::mt19937 rng(7);
  for (char& c : px) c = static_cast<char>(rng());
  const std::string noisy = idx_bytes(0x0803, {3, 28, 28}, px);  // 16 + 3 * 784 = 2368 bytes
  const std::string gz = gzip(noisy);
  ASSERT_GT(gz.size(), 2000u);
  std::string msg = load_error(gz.substr(0, gz.size() / 2), gzip(labels()));
  EXPECT_EQ(msg.rfind(img_path() + ": truncated gzip stream (the compressed data ends early): "
                                   "expected 2368 bytes, got ", 0), 0u)
      << msg;
  // Valid gzip of a short file: the IDX layer reports the sizes.
  EXPECT_EQ(load_error(gzip(noisy.substr(0, 1000)), gzip(labels())),
            img_path() + ": truncated: expected 2368 bytes, got 1000 after decompression");
  std::string corrupt = gz;
  corrupt[gz.size() - 3] ^= 1;  // in ISIZE, the trailer's length field
  EXPECT_EQ(load_error(corrupt, gzip(labels())),
            img_path() + ": corrupt gzip stream (zlib: incorrect length check); the file is damaged, "
                         "download or reinstall it");
  corrupt = gz;
  corrupt[gz.size() / 2] ^= 0xff;  // inside the deflate data
  EXPECT_NE(load_error(corrupt, gzip(labels())).find(img_path() + ": corrupt gzip stream (zlib: "),
            std::string::npos);
}

TEST_F(CraftedFashionMnist, BadStd) {
  FashionMnistOptions o;
  o.std = 0;
  EXPECT_THROW(
      {
        try {
          FashionMnist ds(o);
        } catch (const InvalidArgument& e) {
          EXPECT_STREQ(e.what(), "FashionMnistOptions::std must be > 0, got 0");
          throw;
        }
      },
      InvalidArgument);
}

}  // namespace
}  // namespace datasets
}  // namespace ddp
