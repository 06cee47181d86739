// The IDX reader on crafted buffers and files: every element type (values
// decoded from big-endian), gzip (one member, several members), empty and 0-d
// arrays; each error with its message; the size limit before allocation; and
// a mutation smoke test (anything but ddp::InvalidArgument is a bug).
#include "ddp/datasets/idx.h"

#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ddp/error.h"
#include "test_files.h"

namespace ddp {
namespace datasets {
namespace {

using testing::gzip;
using testing::idx_bytes;

IdxArray parse(const std::string& bytes, const IdxOptions& o = {}) {
  return parse_idx(bytes.data(), bytes.size(), "buf", o);
}

// The message of the ddp::InvalidArgument that parse() throws ("" if none).
std::string parse_error(const std::string& bytes, const IdxOptions& o = {}) {
  try {
    parse(bytes, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// A 2x3 uint8 image file with values 1..6.
std::string small_images() { return idx_bytes(0x00000802, {2, 3}, std::string("\1\2\3\4\5\6", 6)); }

TEST(IdxTest, ParsesUInt8) {
  IdxArray a = parse(small_images());
  EXPECT_EQ(a.magic, 0x00000802u);
  EXPECT_EQ(a.dtype, IdxDtype::kUInt8);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.tensor.scalar_type(), at::kByte);
  EXPECT_TRUE(a.tensor.equal(at::tensor({1, 2, 3, 4, 5, 6}, at::kByte).reshape({2, 3})));
}

TEST(IdxTest, DecodesEveryTypeFromBigEndian) {
  // int8 -1, 127
  EXPECT_TRUE(parse(idx_bytes(0x0901, {2}, "\xff\x7f")).tensor.equal(at::tensor({-1, 127}, at::kChar)));
  // int16 -2, 258
  EXPECT_TRUE(parse(idx_bytes(0x0B01, {2}, std::string("\xff\xfe\x01\x02", 4)))
                  .tensor.equal(at::tensor({-2, 258}, at::kShort)));
  // int32 -5, 0x01020304
  EXPECT_TRUE(parse(idx_bytes(0x0C01, {2}, std::string("\xff\xff\xff\xfb\x01\x02\x03\x04", 8)))
                  .tensor.equal(at::tensor({-5, 0x01020304}, at::kInt)));
  // float32 1.5 = 0x3fc00000, -2.25 = 0xc0100000
  EXPECT_TRUE(parse(idx_bytes(0x0D01, {2}, std::string("\x3f\xc0\0\0\xc0\x10\0\0", 8)))
                  .tensor.equal(at::tensor({1.5f, -2.25f}, at::kFloat)));
  // float64 3.125 = 0x4009000000000000, as a 1x1 array
  IdxArray d = parse(idx_bytes(0x0E02, {1, 1}, std::string("\x40\x09\0\0\0\0\0\0", 8)));
  EXPECT_EQ(d.dtype, IdxDtype::kFloat64);
  EXPECT_EQ(d.tensor.sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(d.tensor.item<double>(), 3.125);
}

TEST(IdxTest, EmptyAndZeroDimensional) {
  IdxArray e = parse(idx_bytes(0x0803, {0, 28, 28}, ""));
  EXPECT_EQ(e.tensor.sizes(), (std::vector<int64_t>{0, 28, 28}));
  IdxArray s = parse(idx_bytes(0x0800, {}, "\x2a"));
  EXPECT_EQ(s.tensor.dim(), 0);
  EXPECT_EQ(s.tensor.item<uint8_t>(), 42);
  // An empty array's other sizes are bounded too (libtorch checks that
  // their product fits in 64 bits; found by fuzzing).
  EXPECT_NE(parse_error(idx_bytes(0x0807, {255, 0xff5f3000u, 0xae9c1d00u, 0, 2607561, 0xc9c9c9c9u, 0xc9c9c92au},
                                   "")).find("more than the limit"),
            std::string::npos);
  EXPECT_EQ(parse(idx_bytes(0x0D03, {0, 1000, 1000}, "")).tensor.sizes(), (std::vector<int64_t>{0, 1000, 1000}));
}

TEST(IdxTest, GzipOneAndSeveralMembers) {
  const std::string raw = small_images();
  EXPECT_TRUE(parse(gzip(raw)).tensor.equal(parse(raw).tensor));
  // gunzip treats concatenated members as one stream; so do we.
  const std::string two = gzip(raw.substr(0, 7)) + gzip(raw.substr(7));
  EXPECT_TRUE(parse(two).tensor.equal(parse(raw).tensor));
}

TEST(IdxTest, TruncatedPlain) {
  const std::string raw = small_images();  // 4 + 8 + 6 = 18 bytes
  EXPECT_EQ(parse_error(raw.substr(0, 15)), "buf: truncated: expected 18 bytes, got 15");
  EXPECT_EQ(parse_error(raw.substr(0, 3)), "buf: truncated: expected at least 4 bytes, got 3");
  EXPECT_EQ(parse_error(raw.substr(0, 9)), "buf: truncated: expected at least 12 bytes, got 9");
  try {
    parse_idx(nullptr, 0, "empty");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "empty: truncated: expected at least 4 bytes, got 0");
  }
}

TEST(IdxTest, TruncatedGzip) {
  // Enough incompressible payload that cutting the stream cuts the data.
  std::string payload;
  std::mt19937 rng(1);
  for (int i = 0; i < 5000; ++i) payload.push_back(static_cast<char>(rng()));
  const std::string gz = gzip(idx_bytes(0x0801, {5000}, payload));
  std::string msg = parse_error(gz.substr(0, gz.size() / 2));
  EXPECT_EQ(msg.rfind("buf: truncated gzip stream (the compressed data ends early): expected 5008 bytes, got ", 0),
            0u)
      << msg;
  EXPECT_NE(msg.find("after decompression"), std::string::npos) << msg;
  // Only the 8-byte trailer (CRC-32, length) missing.
  EXPECT_EQ(parse_error(gz.substr(0, gz.size() - 8)),
            "buf: truncated gzip stream: the data is complete but the gzip trailer is missing");
}

TEST(IdxTest, CorruptGzip) {
  std::string gz = gzip(small_images());
  std::string bad_crc = gz;
  bad_crc[gz.size() - 8] ^= 0x55;
  EXPECT_EQ(parse_error(bad_crc),
            "buf: corrupt gzip stream (zlib: incorrect data check); the file is damaged, "
            "download or reinstall it");
  std::string bad_method = gz;
  bad_method[2] = 7;  // compression method byte: only 8 (deflate) exists
  EXPECT_NE(parse_error(bad_method).find("corrupt gzip stream (zlib: unknown compression method)"),
            std::string::npos);
  // Garbage after a complete member is neither data nor another member.
  EXPECT_NE(parse_error(gz + "garbage").find("corrupt gzip stream (zlib: incorrect header check)"),
            std::string::npos);
}

TEST(IdxTest, BadMagicNumber) {
  IdxOptions o;
  o.expected_magic = idx_magic(IdxDtype::kUInt8, 3);
  EXPECT_EQ(o.expected_magic, 0x00000803u);
  EXPECT_EQ(parse_error(idx_bytes(0x0801, {1}, "\1"), o),
            "buf: bad magic number: expected 0x00000803 (uint8, 3 dimensions), got 0x00000801 "
            "(uint8, 1 dimension); is this the right file?");
  EXPECT_EQ(parse_error(idx_bytes(0x12340801, {1}, "\1")),
            "buf: bad magic number 0x12340801 (not an IDX magic number): IDX files start with "
            "0x0000TTNN, TT a type byte in 08,09,0B,0C,0D,0E; is this an IDX file?");
  EXPECT_NE(parse_error(idx_bytes(0x0A01, {1}, "\1")).find("bad magic number 0x00000a01"),
            std::string::npos);
}

TEST(IdxTest, DeclaredSizeOverLimitFailsBeforeAllocating) {
  // 1e15 bytes: would fail to allocate (or worse) if not checked first.
  EXPECT_EQ(parse_error(idx_bytes(0x0803, {100000, 100000, 100000}, "")),
            "buf: the header declares sizes [100000, 100000, 100000] of uint8, more than the limit "
            "of 1073741824 bytes (IdxOptions::max_bytes); the file is corrupt, or raise the limit");
  // 8 * (2^32-1)^4 overflows 64 bits: still the limit error.
  EXPECT_NE(parse_error(idx_bytes(0x0E04, {~0u, ~0u, ~0u, ~0u}, "")).find("more than the limit"),
            std::string::npos);
  IdxOptions small;
  small.max_bytes = 5;
  EXPECT_NE(parse_error(small_images(), small).find("more than the limit of 5 bytes"), std::string::npos);
  small.max_bytes = 6;
  EXPECT_EQ(parse(small_images(), small).tensor.numel(), 6);
  // A gzip bomb is bounded the same way: its header is read first.
  EXPECT_NE(parse_error(gzip(idx_bytes(0x0801, {2000000000}, std::string(1000, '\0')))).find("limit"),
            std::string::npos);
}

TEST(IdxTest, TrailingData) {
  EXPECT_EQ(parse_error(small_images() + "x"),
            "buf: trailing data after the 18 bytes that the header declares; the file is corrupt");
  EXPECT_NE(parse_error(gzip(small_images() + "x")).find("trailing data"), std::string::npos);
}

TEST(IdxTest, ReadsFilesPlainAndGzip) {
  testing::TempDir dir;
  testing::write_file(dir.file("a-idx2-ubyte"), small_images());
  testing::write_file(dir.file("a-idx2-ubyte.gz"), gzip(small_images()));
  IdxArray plain = read_idx_file(dir.file("a-idx2-ubyte"));
  IdxArray gz = read_idx_file(dir.file("a-idx2-ubyte.gz"));
  EXPECT_TRUE(plain.tensor.equal(gz.tensor));
  EXPECT_EQ(gz.dims, (std::vector<int64_t>{2, 3}));
  testing::write_file(dir.file("short.gz"), gzip(small_images().substr(0, 16)));
  try {
    read_idx_file(dir.file("short.gz"));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.file("short.gz") + ": truncated: expected 18 bytes, got 16 after decompression");
  }
}

TEST(IdxTest, MissingFile) {
  try {
    read_idx_file("/nonexistent-ddp/x-idx1-ubyte.gz");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent-ddp/x-idx1-ubyte.gz: cannot open: No such file or directory");
  }
}

// Random byte flips, cuts and insertions on valid plain and gzip files: the
// reader either parses or throws ddp::InvalidArgument, never anything else
// (the libFuzzer target does this at scale).
TEST(IdxTest, MutatedInputsOnlyThrowInvalidArgument) {
  const std::string seeds[] = {small_images(), gzip(small_images()),
                               idx_bytes(0x0C02, {2, 2}, std::string(16, '\x7f'))};
  std::mt19937 rng(12345);
  IdxOptions o;
  o.max_bytes = 1 << 20;
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = seeds[iter % 3];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = static_cast<char>(rng()); break;
        case 1: s.resize(at); break;
        default: s.insert(at, 1, static_cast<char>(rng())); break;
      }
    }
    try {
      parse(s, o);
      ++ok;
    } catch (const InvalidArgument&) {
      ++rejected;
    }
  }
  // An exception of another type would have failed the test above.
  EXPECT_GT(rejected, 1500) << ok << " mutated inputs parsed";
}

}  // namespace
}  // namespace datasets
}  // namespace ddp
