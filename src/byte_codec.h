// Internal: little-endian fields and tensors written into, and read back
// from, a byte string with every length checked. The one codec below
// checkpoints (checkpoint/checkpoint_format.h) and optimizer states
// (optimizer_state.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace ddp::detail {

// Appends little-endian fields to a byte string.
class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
  }
  void string(const std::string& s);
  // dtype code, dims, raw contiguous bytes (copied through CPU).
  // An undefined tensor is the single code 0.
  void tensor(const at::Tensor& t);
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Reads fields back, checking every length against what remains; every
// failure throws InvalidArgument naming the source and the byte offset.
class ByteReader {
 public:
  ByteReader(const char* data, size_t size, std::string source)
      : data_(data), size_(size), source_(std::move(source)) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64();
  double f64();
  std::string string(const char* what);
  // A count of items each taking at least `min_item_bytes`: bounded by what
  // remains, so a corrupt count cannot cause a huge loop or allocation.
  uint32_t count(const char* what, size_t min_item_bytes);
  // A CPU tensor (undefined for code 0), then moved to `device`.
  at::Tensor tensor(const char* what, const c10::Device& device);
  size_t remaining() const { return size_ - pos_; }
  size_t offset() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void raw(void* p, size_t n, const char* what);
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string source_;
};

}  // namespace ddp::detail
