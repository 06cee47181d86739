// IDX parser: magic number, sizes (checked against the limit before the one
// allocation), payload, nothing after it. Bytes come through
// detail::Reader (byte_reader.h), which gunzips. See idx.h.
#include "ddp/datasets/idx.h"

#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "byte_reader.h"
#include "ddp/error.h"

namespace ddp {
namespace datasets {
namespace {

using detail::fail;
using detail::FileInput;
using detail::Input;
using detail::MemoryInput;
using detail::Reader;

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool known_dtype(uint8_t t) {
  return t == 0x08 || t == 0x09 || t == 0x0B || t == 0x0C || t == 0x0D || t == 0x0E;
}

std::string describe_magic(uint32_t magic) {
  uint8_t t = (magic >> 8) & 0xff;
  int nd = magic & 0xff;
  if ((magic >> 16) != 0 || !known_dtype(t)) return fmt::format("0x{:08x} (not an IDX magic number)", magic);
  return fmt::format("0x{:08x} ({}, {} dimension{})", magic, to_string(static_cast<IdxDtype>(t)), nd,
                     nd == 1 ? "" : "s");
}

at::ScalarType scalar_type(IdxDtype d) {
  switch (d) {
    case IdxDtype::kUInt8: return at::kByte;
    case IdxDtype::kInt8: return at::kChar;
    case IdxDtype::kInt16: return at::kShort;
    case IdxDtype::kInt32: return at::kInt;
    case IdxDtype::kFloat32: return at::kFloat;
    case IdxDtype::kFloat64: return at::kDouble;
  }
  return at::kByte;
}

[[noreturn]] void fail_truncated(const Reader& r, const std::string& name, const std::string& expected,
                                 size_t got) {
  fail(name, fmt::format("truncated{}: expected {} bytes, got {}{}",
                         r.truncated_gzip() ? " gzip stream (the compressed data ends early)" : "",
                         expected, got, r.gzip() ? " after decompression" : ""));
}

// Reads and checks the magic number and sizes; returns the header length.
size_t parse_header(Reader& r, const std::string& name, const IdxOptions& o, IdxArray* out) {
  uint8_t head[4];
  size_t got = r.read(head, 4);
  if (got < 4) fail_truncated(r, name, "at least 4", got);
  out->magic = load_be32(head);
  if (head[0] != 0 || head[1] != 0 || !known_dtype(head[2])) {
    fail(name, fmt::format("bad magic number {}: IDX files start with 0x0000TTNN, "
                           "TT a type byte in 08,09,0B,0C,0D,0E; is this an IDX file?",
                           describe_magic(out->magic)));
  }
  if (o.expected_magic && *o.expected_magic != out->magic) {
    fail(name, fmt::format("bad magic number: expected {}, got {}; is this the right file?",
                           describe_magic(*o.expected_magic), describe_magic(out->magic)));
  }
  out->dtype = static_cast<IdxDtype>(head[2]);
  const size_t ndim = head[3];
  std::vector<uint8_t> raw(4 * ndim);
  got = r.read(raw.data(), raw.size());
  if (got < raw.size()) fail_truncated(r, name, fmt::format("at least {}", 4 + raw.size()), 4 + got);
  out->dims.resize(ndim);
  for (size_t i = 0; i < ndim; ++i) out->dims[i] = load_be32(&raw[4 * i]);
  return 4 + raw.size();
}

// The payload size in bytes, or an error if it exceeds the limit.
size_t checked_payload(const std::string& name, const IdxOptions& o, const IdxArray& a) {
  // Multiply with a check against the limit at every step: no overflow.
  // Zero sizes are skipped, so the other sizes of an empty array are bounded
  // too (libtorch rejects shapes whose nonzero sizes overflow 64 bits).
  size_t bytes = element_size(a.dtype);
  bool over = bytes > o.max_bytes;
  bool empty = false;
  for (size_t i = 0; i < a.dims.size() && !over; ++i) {
    const auto d = static_cast<size_t>(a.dims[i]);
    empty = empty || d == 0;
    if (d == 0) continue;
    over = bytes > o.max_bytes / d;
    bytes *= over ? 1 : d;
  }
  if (over) {
    fail(name, fmt::format("the header declares sizes [{}] of {}, more than the limit of {} bytes "
                           "(IdxOptions::max_bytes); the file is corrupt, or raise the limit",
                           fmt::join(a.dims, ", "), to_string(a.dtype), o.max_bytes));
  }
  return empty ? 0 : bytes;
}

// IDX is big-endian; swap each element in place on a little-endian host.
void to_host_order(at::Tensor& t, size_t elem) {
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < n; ++i, p += elem) std::reverse(p, p + elem);
#else
  (void)t;
  (void)elem;
#endif
}

IdxArray parse(Input& in, const std::string& name, const IdxOptions& o) {
  if (o.max_bytes == 0) fail(name, "IdxOptions::max_bytes must be > 0");
  Reader r(in, name);
  IdxArray out;
  const size_t header = parse_header(r, name, o, &out);
  const size_t payload = checked_payload(name, o, out);
  try {
    out.tensor = at::empty(out.dims, at::TensorOptions().dtype(scalar_type(out.dtype)));
  } catch (const c10::Error& e) {
    fail(name, fmt::format("cannot allocate sizes [{}]: {}", fmt::join(out.dims, ", "), e.what_without_backtrace()));
  }
  size_t got = r.read(static_cast<uint8_t*>(out.tensor.data_ptr()), payload);
  if (got < payload) fail_truncated(r, name, std::to_string(header + payload), header + got);
  uint8_t extra;
  if (r.read(&extra, 1) != 0) {
    fail(name, fmt::format("trailing data after the {} bytes that the header declares; "
                           "the file is corrupt", header + payload));
  }
  if (r.truncated_gzip()) {
    fail(name, "truncated gzip stream: the data is complete but the gzip trailer is missing");
  }
  const size_t elem = element_size(out.dtype);
  if (elem > 1) to_host_order(out.tensor, elem);
  return out;
}

}  // namespace

const char* to_string(IdxDtype dtype) {
  switch (dtype) {
    case IdxDtype::kUInt8: return "uint8";
    case IdxDtype::kInt8: return "int8";
    case IdxDtype::kInt16: return "int16";
    case IdxDtype::kInt32: return "int32";
    case IdxDtype::kFloat32: return "float32";
    case IdxDtype::kFloat64: return "float64";
  }
  return "unknown";
}

size_t element_size(IdxDtype dtype) {
  switch (dtype) {
    case IdxDtype::kUInt8:
    case IdxDtype::kInt8: return 1;
    case IdxDtype::kInt16: return 2;
    case IdxDtype::kInt32:
    case IdxDtype::kFloat32: return 4;
    case IdxDtype::kFloat64: return 8;
  }
  return 1;
}

uint32_t idx_magic(IdxDtype dtype, int ndim) {
  return (static_cast<uint32_t>(dtype) << 8) | (static_cast<uint32_t>(ndim) & 0xff);
}

IdxArray parse_idx(const void* data, size_t size, const std::string& name, const IdxOptions& options) {
  MemoryInput in(data, size);
  return parse(in, name, options);
}

IdxArray read_idx_file(const std::string& path, const IdxOptions& options) {
  FileInput in(path);
  return parse(in, path, options);
}

}  // namespace datasets
}  // namespace ddp
