// Internal to libddp: the bytes of a buffer or a file, gunzipped on the fly
// when they start with the gzip magic 1f 8b. The IDX parser (idx.cc) reads
// through it; kept apart so that idx.cc reads as the format does.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ddp {
namespace datasets {
namespace detail {

// Throws ddp::InvalidArgument("<name>: <what>").
[[noreturn]] void fail(const std::string& name, const std::string& what);

// A source of input bytes in chunks; next() returns false at the end.
class Input {
 public:
  virtual ~Input() = default;
  virtual bool next(const uint8_t** data, size_t* size) = 0;
};

// A caller's buffer, which must outlive the MemoryInput.
class MemoryInput : public Input {
 public:
  MemoryInput(const void* data, size_t size) : p_(static_cast<const uint8_t*>(data)), left_(size) {}
  bool next(const uint8_t** data, size_t* size) override;

 private:
  const uint8_t* p_;
  size_t left_;
};

// A file read in 64 KiB chunks. The constructor throws (naming the path)
// if it cannot be opened; next() if a read fails.
class FileInput : public Input {
 public:
  explicit FileInput(const std::string& path);
  ~FileInput() override;
  FileInput(const FileInput&) = delete;
  FileInput& operator=(const FileInput&) = delete;
  bool next(const uint8_t** data, size_t* size) override;

 private:
  std::string path_;
  std::vector<uint8_t> buf_;
  std::FILE* f_ = nullptr;
};

// The decompressed (or plain) bytes of an Input. read() returns fewer bytes
// than asked only at the end of the data; truncated_gzip() then says whether
// that end was a gzip stream cut short. Throws ddp::InvalidArgument naming
// `name` for a corrupt gzip stream (zlib's message).
class Reader {
 public:
  Reader(Input& in, std::string name);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  size_t read(uint8_t* dst, size_t n) { return gzip_ ? read_gzip(dst, n) : read_plain(dst, n); }
  bool gzip() const { return gzip_; }
  bool truncated_gzip() const { return truncated_gzip_; }

 private:
  bool refill();
  size_t read_plain(uint8_t* dst, size_t n);
  size_t read_gzip(uint8_t* dst, size_t n);
  int inflate_some(uint8_t* dst, size_t n, size_t* produced);

  Input& in_;
  std::string name_;
  const uint8_t* next_ = nullptr;  // unread input of the current chunk
  size_t avail_ = 0;
  bool eof_ = false;
  bool gzip_ = false;
  bool member_ended_ = false;  // the last gzip member ended cleanly
  bool truncated_gzip_ = false;
  z_stream z_{};
};

}  // namespace detail
}  // namespace datasets
}  // namespace ddp
