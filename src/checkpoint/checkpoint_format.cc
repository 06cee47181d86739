// The checkpoint byte format: bounds-checked reading and writing of fields,
// tensors, optimizer snapshots, and the framed, checksummed file.
#include "checkpoint_format.h"

#include <ATen/ops/empty.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "ddp/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checkpoint format is little-endian; add byte swapping");

namespace ddp {
namespace detail {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '\n'};
constexpr char kEndMagic[8] = {'D', 'D', 'P', 'E', 'N', 'D', '\n', '\0'};
constexpr size_t kHeaderBytes = 8 + 4 + 4;
constexpr size_t kTrailerBytes = 8 + 4 + 8;
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

uint32_t crc32_of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), n);
    data += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
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

// --- composite records --------------------------------------------------------

void write_fields(ByteWriter& w, const OptimizerFields& fields) {
  w.u32(static_cast<uint32_t>(fields.size()));
  for (const OptimizerField& f : fields) {
    w.string(f.name);
    w.u8(static_cast<uint8_t>(f.kind));
    switch (f.kind) {
      case OptimizerField::Kind::kTensor: w.tensor(f.tensor); break;
      case OptimizerField::Kind::kInt: w.i64(f.integer); break;
      case OptimizerField::Kind::kReal: w.f64(f.real); break;
      case OptimizerField::Kind::kBool: w.u8(f.flag ? 1 : 0); break;
    }
  }
}

OptimizerFields read_fields(ByteReader& r, const c10::Device& device) {
  OptimizerFields fields(r.count("optimizer fields", 6));
  for (OptimizerField& f : fields) {
    f.name = r.string("an optimizer field name");
    uint8_t kind = r.u8();
    if (kind > 3) r.fail("optimizer field '" + f.name + "' has unknown kind " + std::to_string(kind));
    f.kind = static_cast<OptimizerField::Kind>(kind);
    switch (f.kind) {
      case OptimizerField::Kind::kTensor: f.tensor = r.tensor("an optimizer tensor", device); break;
      case OptimizerField::Kind::kInt: f.integer = r.i64(); break;
      case OptimizerField::Kind::kReal: f.real = r.f64(); break;
      case OptimizerField::Kind::kBool: f.flag = r.u8() != 0; break;
    }
  }
  return fields;
}

void write_optimizer(ByteWriter& w, const OptimizerSnapshot& s) {
  w.string(s.type);
  w.string(s.archive);
  w.u32(static_cast<uint32_t>(s.groups.size()));
  for (const auto& g : s.groups) {
    write_fields(w, g.options);
    w.u32(static_cast<uint32_t>(g.state.size()));
    for (const auto& st : g.state) {
      w.u8(st ? 1 : 0);
      if (st) write_fields(w, *st);
    }
  }
}

OptimizerSnapshot read_optimizer(ByteReader& r, const c10::Device& device) {
  OptimizerSnapshot s;
  s.type = r.string("the optimizer type");
  s.archive = r.string("the optimizer archive");
  s.groups.resize(r.count("parameter groups", 8));
  for (auto& g : s.groups) {
    g.options = read_fields(r, device);
    g.state.resize(r.count("group parameters", 1));
    for (auto& st : g.state) {
      uint8_t has = r.u8();
      if (has > 1) r.fail("a parameter state flag of " + std::to_string(has));
      if (has) st = read_fields(r, device);
    }
  }
  return s;
}

void write_rng(ByteWriter& w, const RngState& s) {
  w.tensor(s.cpu);
  w.u32(static_cast<uint32_t>(s.cuda.size()));
  for (const at::Tensor& t : s.cuda) w.tensor(t);
}

RngState read_rng(ByteReader& r) {
  const c10::Device cpu(c10::kCPU);
  RngState s;
  s.cpu = r.tensor("a CPU generator state", cpu);
  s.cuda.resize(r.count("CUDA generator states", 1));
  for (at::Tensor& t : s.cuda) t = r.tensor("a CUDA generator state", cpu);
  for (const at::Tensor* t : {&s.cpu}) {
    if (t->defined() && (t->scalar_type() != at::kByte || t->dim() != 1)) {
      r.fail("a generator state that is not a 1-D uint8 tensor");
    }
  }
  for (const at::Tensor& t : s.cuda) {
    if (!t.defined() || t.scalar_type() != at::kByte || t.dim() != 1) {
      r.fail("a CUDA generator state that is not a 1-D uint8 tensor");
    }
  }
  return s;
}

}  // namespace detail

// --- the file -----------------------------------------------------------------

std::string serialize_checkpoint(const Checkpoint& ckpt) {
  detail::ByteWriter w;
  w.raw(detail::kMagic, 8);
  w.u32(kCheckpointFormatVersion);
  w.u32(0);  // flags: none defined
  const size_t start = w.bytes().size();
  w.i64(ckpt.epoch);
  w.i64(ckpt.step);
  w.u32(static_cast<uint32_t>(ckpt.model.size()));
  for (const auto& item : ckpt.model) {
    w.string(item.key());
    w.tensor(item.value());
  }
  w.u8(ckpt.optimizer ? 1 : 0);
  if (ckpt.optimizer) detail::write_optimizer(w, *ckpt.optimizer);
  w.u32(static_cast<uint32_t>(ckpt.rng.size()));
  for (const RngState& s : ckpt.rng) detail::write_rng(w, s);
  w.u32(static_cast<uint32_t>(ckpt.metadata.size()));
  for (const auto& [k, v] : ckpt.metadata) {
    w.string(k);
    w.string(v);
  }
  const size_t length = w.bytes().size() - start;
  const uint32_t crc = detail::crc32_of(w.bytes().data() + start, length);
  w.u64(length);
  w.u32(crc);
  w.raw(detail::kEndMagic, 8);
  return std::move(w.bytes());
}

namespace {

// Checks the frame (magic, version, length, CRC); returns the payload.
std::pair<const char*, size_t> unframe(const std::string& b,
                                       const std::string& source) {
  using namespace detail;
  auto bad = [&](const std::string& what) {
    return InvalidArgument("checkpoint '" + source + "' " + what);
  };
  if (b.empty()) {
    throw bad("is empty (0 bytes): it was truncated or never written; delete "
              "it to fall back to an older checkpoint");
  }
  if (std::memcmp(b.data(), kMagic, std::min<size_t>(b.size(), 8)) != 0) {
    throw bad("is not a ddp checkpoint (no DDPCKPT header; " +
              std::to_string(b.size()) + " bytes)");
  }
  if (b.size() < kHeaderBytes + kTrailerBytes ||
      std::memcmp(b.data() + b.size() - 8, kEndMagic, 8) != 0) {
    throw bad("is truncated or was not completely written (" +
              std::to_string(b.size()) +
              " bytes, no end marker); delete it to fall back to an older "
              "checkpoint");
  }
  uint32_t version, flags, crc;
  uint64_t length;
  std::memcpy(&version, b.data() + 8, 4);
  std::memcpy(&flags, b.data() + 12, 4);
  std::memcpy(&length, b.data() + b.size() - kTrailerBytes, 8);
  std::memcpy(&crc, b.data() + b.size() - kTrailerBytes + 8, 4);
  if (version != kCheckpointFormatVersion) {
    throw bad("has format version " + std::to_string(version) +
              "; this build of ddp reads version " +
              std::to_string(kCheckpointFormatVersion));
  }
  if (flags != 0) throw bad("has unknown flags " + std::to_string(flags));
  const size_t payload = b.size() - kHeaderBytes - kTrailerBytes;
  if (length != payload) {
    throw bad("is truncated or corrupt: its trailer records a payload of " +
              std::to_string(length) + " bytes, the file holds " +
              std::to_string(payload));
  }
  const uint32_t actual = crc32_of(b.data() + kHeaderBytes, payload);
  if (actual != crc) {
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  "is corrupt: CRC-32 of the payload is %08x, the file "
                  "records %08x; delete it to fall back to an older "
                  "checkpoint",
                  actual, crc);
    throw bad(msg);
  }
  return {b.data() + kHeaderBytes, payload};
}

}  // namespace

Checkpoint parse_checkpoint(const std::string& bytes, const std::string& source,
                            const c10::Device& device) {
  auto [data, size] = unframe(bytes, source);
  detail::ByteReader r(data, size, source);
  Checkpoint c;
  c.path = source;
  c.epoch = r.i64();
  c.step = r.i64();
  if (c.epoch < 0 || c.step < 0) r.fail("negative epoch or step");
  uint32_t n = r.count("model tensors", 5);
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = r.string("a model key");
    at::Tensor t = r.tensor("a model tensor", device);
    if (!t.defined()) r.fail("model tensor '" + name + "' is undefined");
    if (c.model.contains(name)) r.fail("model key '" + name + "' appears twice");
    c.model.insert(std::move(name), std::move(t));
  }
  uint8_t has_optimizer = r.u8();
  if (has_optimizer > 1) r.fail("an optimizer flag of " + std::to_string(has_optimizer));
  if (has_optimizer) {
    c.optimizer = std::make_shared<const detail::OptimizerSnapshot>(
        detail::read_optimizer(r, device));
  }
  c.rng.resize(r.count("RNG states", 5));
  for (RngState& s : c.rng) s = detail::read_rng(r);
  uint32_t m = r.count("metadata entries", 8);
  for (uint32_t i = 0; i < m; ++i) {
    std::string k = r.string("a metadata key");
    c.metadata[k] = r.string("a metadata value");
  }
  if (r.remaining() != 0) {
    r.fail(std::to_string(r.remaining()) + " unexpected bytes after the content");
  }
  return c;
}

}  // namespace ddp
