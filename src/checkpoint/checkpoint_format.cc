// The checkpoint byte format: bounds-checked reading and writing of fields,
// tensors, optimizer snapshots, and the framed, checksummed file.
#include "checkpoint_format.h"

#include "optimizer_state.h"

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
    c.optimizer = std::make_shared<const OptimizerState>(
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

}  // namespace detail
}  // namespace ddp
