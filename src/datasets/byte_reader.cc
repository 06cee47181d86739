// Chunked input and streaming gunzip (zlib). See byte_reader.h.
#include "byte_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddp/error.h"

namespace ddp {
namespace datasets {
namespace detail {
namespace {

// zlib counts in uInt (32 bits): never hand it more than this at once.
constexpr size_t kMaxZlibChunk = size_t{1} << 30;
constexpr size_t kFileChunk = size_t{64} << 10;

}  // namespace

void fail(const std::string& name, const std::string& what) { throw InvalidArgument(name + ": " + what); }

bool MemoryInput::next(const uint8_t** data, size_t* size) {
  if (left_ == 0) return false;
  *data = p_;
  *size = std::min(left_, kMaxZlibChunk);
  p_ += *size;
  left_ -= *size;
  return true;
}

FileInput::FileInput(const std::string& path) : path_(path), buf_(kFileChunk) {
  f_ = std::fopen(path.c_str(), "rb");
  if (f_ == nullptr) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
}

FileInput::~FileInput() { std::fclose(f_); }

bool FileInput::next(const uint8_t** data, size_t* size) {
  const size_t n = std::fread(buf_.data(), 1, buf_.size(), f_);
  if (n == 0 && std::ferror(f_)) fail(path_, fmt::format("read error: {}", std::strerror(errno)));
  *data = buf_.data();
  *size = n;
  return n > 0;
}

Reader::Reader(Input& in, std::string name) : in_(in), name_(std::move(name)) {
  refill();
  gzip_ = avail_ >= 2 && next_[0] == 0x1f && next_[1] == 0x8b;
  // 15 + 16: a gzip wrapper (not zlib's), whose CRC-32 and length zlib checks.
  if (gzip_ && inflateInit2(&z_, 15 + 16) != Z_OK) {
    gzip_ = false;
    fail(name_, "zlib inflateInit2 failed (out of memory?)");
  }
}

Reader::~Reader() {
  if (gzip_) inflateEnd(&z_);
}

bool Reader::refill() {
  if (avail_ == 0 && !eof_) eof_ = !in_.next(&next_, &avail_);
  return avail_ > 0;
}

size_t Reader::read_plain(uint8_t* dst, size_t n) {
  size_t done = 0;
  while (done < n && refill()) {
    size_t k = std::min(n - done, avail_);
    std::memcpy(dst + done, next_, k);
    done += k;
    next_ += k;
    avail_ -= k;
  }
  return done;
}

int Reader::inflate_some(uint8_t* dst, size_t n, size_t* produced) {
  size_t in_now = std::min(avail_, kMaxZlibChunk);
  size_t out_now = std::min(n, kMaxZlibChunk);
  z_.next_in = const_cast<Bytef*>(next_);
  z_.avail_in = static_cast<uInt>(in_now);
  z_.next_out = dst;
  z_.avail_out = static_cast<uInt>(out_now);
  int rc = inflate(&z_, Z_NO_FLUSH);
  size_t consumed = in_now - z_.avail_in;
  next_ += consumed;
  avail_ -= consumed;
  *produced = out_now - z_.avail_out;
  return rc;
}

size_t Reader::read_gzip(uint8_t* dst, size_t n) {
  size_t done = 0;
  while (done < n) {
    if (!refill()) {
      truncated_gzip_ = !member_ended_;
      break;
    }
    if (member_ended_) {
      // More input after a complete member: gunzip reads it as another
      // member; so do we (anything else is reported as corrupt below).
      inflateReset(&z_);
      member_ended_ = false;
    }
    size_t produced = 0;
    int rc = inflate_some(dst + done, n - done, &produced);
    done += produced;
    if (rc == Z_STREAM_END) {
      member_ended_ = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      fail(name_, fmt::format("corrupt gzip stream (zlib: {}); the file is damaged, "
                              "download or reinstall it",
                              z_.msg != nullptr ? z_.msg : zError(rc)));
    }
  }
  return done;
}

}  // namespace detail
}  // namespace datasets
}  // namespace ddp
