// ByteWriter and ByteReader (byte_codec.h): bounds-checked little-endian
// fields and tensors, the one codec of checkpoints and optimizer states.
#include "byte_codec.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "ddp/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the byte codec is little-endian; add byte swapping");

namespace ddp::detail {
namespace {

constexpr uint32_t kMaxDims = 64;

// Stable codes: the file must not depend on c10's enum numbering.
struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
constexpr DtypeCode kDtypes[] = {
    {1, at::kFloat},  {2, at::kDouble}, {3, at::kHalf},
    {4, at::kBFloat16}, {5, at::kChar}, {6, at::kByte},
    {7, at::kShort},  {8, at::kInt},    {9, at::kLong},
    {10, at::kBool},  {11, at::kComplexFloat}, {12, at::kComplexDouble}};

uint8_t code_of(at::ScalarType t) {
  for (const DtypeCode& d : kDtypes) {
    if (d.type == t) return d.code;
  }
  throw InvalidArgument(std::string("checkpoint: tensors of dtype ") +
                        c10::toString(t) +
                        " cannot be saved (supported: floating, integer, "
                        "bool and complex dtypes)");
}

}  // namespace

// --- ByteWriter -------------------------------------------------------------

void ByteWriter::string(const std::string& s) {
  if (s.size() > std::numeric_limits<uint32_t>::max()) {
    throw InvalidArgument("checkpoint: a string of " +
                          std::to_string(s.size()) +
                          " bytes is too long to save (limit 4 GiB)");
  }
  u32(static_cast<uint32_t>(s.size()));
  raw(s.data(), s.size());
}

void ByteWriter::tensor(const at::Tensor& t) {
  if (!t.defined()) {
    u8(0);
    return;
  }
  u8(code_of(t.scalar_type()));
  if (t.dim() > static_cast<int64_t>(kMaxDims)) {
    throw InvalidArgument("checkpoint: a tensor with " +
                          std::to_string(t.dim()) + " dimensions cannot be "
                          "saved (limit " + std::to_string(kMaxDims) + ")");
  }
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  u8(static_cast<uint8_t>(c.dim()));
  for (int64_t d : c.sizes()) i64(d);
  uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
  u64(nbytes);
  raw(c.data_ptr(), nbytes);
}

// --- ByteReader -------------------------------------------------------------

void ByteReader::fail(const std::string& what) const {
  throw InvalidArgument("checkpoint '" + source_ + "' is corrupt: " + what +
                        " (at payload byte " + std::to_string(pos_) +
                        "); delete it to fall back to an older checkpoint");
}

void ByteReader::raw(void* p, size_t n, const char* what) {
  if (n > remaining()) {
    fail(std::string(what) + " needs " + std::to_string(n) +
         " bytes but only " + std::to_string(remaining()) + " remain");
  }
  std::memcpy(p, data_ + pos_, n);
  pos_ += n;
}

uint8_t ByteReader::u8() { uint8_t v; raw(&v, 1, "a byte"); return v; }
uint32_t ByteReader::u32() { uint32_t v; raw(&v, 4, "a u32"); return v; }
uint64_t ByteReader::u64() { uint64_t v; raw(&v, 8, "a u64"); return v; }
int64_t ByteReader::i64() { int64_t v; raw(&v, 8, "an i64"); return v; }
double ByteReader::f64() { double v; raw(&v, 8, "a double"); return v; }

std::string ByteReader::string(const char* what) {
  uint32_t n = u32();
  if (n > remaining()) {
    fail(std::string(what) + " claims " + std::to_string(n) +
         " bytes but only " + std::to_string(remaining()) + " remain");
  }
  std::string s(data_ + pos_, n);
  pos_ += n;
  return s;
}

uint32_t ByteReader::count(const char* what, size_t min_item_bytes) {
  uint32_t n = u32();
  if (min_item_bytes > 0 && n > remaining() / min_item_bytes) {
    fail(std::string("the number of ") + what + " (" + std::to_string(n) +
         ") exceeds what the remaining " + std::to_string(remaining()) +
         " bytes can hold");
  }
  return n;
}

at::Tensor ByteReader::tensor(const char* what, const c10::Device& device) {
  uint8_t code = u8();
  if (code == 0) return at::Tensor();
  const DtypeCode* dtype = nullptr;
  for (const DtypeCode& d : kDtypes) {
    if (d.code == code) dtype = &d;
  }
  if (dtype == nullptr) fail(std::string(what) + ": unknown dtype code " + std::to_string(code));
  uint8_t ndim = u8();
  if (ndim > kMaxDims) fail(std::string(what) + ": " + std::to_string(ndim) + " dimensions");
  const uint64_t elem = c10::elementSize(dtype->type);
  std::vector<int64_t> sizes(ndim);
  // Bound the product of max(size, 1) so that strides cannot overflow even
  // for zero-element tensors.
  uint64_t numel = 1, span = 1;
  for (auto& s : sizes) {
    s = i64();
    const uint64_t limit = (uint64_t{1} << 62) / elem;
    if (s < 0 || static_cast<uint64_t>(s) > limit ||
        span > limit / std::max<uint64_t>(static_cast<uint64_t>(s), 1)) {
      fail(std::string(what) + ": invalid or too large size " + std::to_string(s));
    }
    span *= std::max<uint64_t>(static_cast<uint64_t>(s), 1);
    numel *= static_cast<uint64_t>(s);
  }
  uint64_t nbytes = u64();
  if (nbytes != numel * elem) {
    fail(std::string(what) + ": " + std::to_string(nbytes) + " data bytes for " +
         std::to_string(numel) + " elements of " + std::to_string(elem) + " bytes");
  }
  if (nbytes > remaining()) {
    fail(std::string(what) + ": " + std::to_string(nbytes) +
         " data bytes but only " + std::to_string(remaining()) + " remain");
  }
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype->type));
  if (nbytes > 0) std::memcpy(t.data_ptr(), data_ + pos_, nbytes);
  if (dtype->type == at::kBool) {
    for (uint64_t i = 0; i < nbytes; ++i) {
      if (static_cast<uint8_t>(data_[pos_ + i]) > 1) {
        fail(std::string(what) + ": a bool that is neither 0 nor 1");
      }
    }
  }
  pos_ += nbytes;
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace ddp::detail
