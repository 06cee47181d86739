// Internal: the byte layout of checkpoints (see include/ddp/checkpoint.h)
// and the optimizer snapshot that checkpoint_optim.cc fills.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"

namespace ddp {
namespace detail {

// One named value of an optimizer's options or per-parameter state.
struct OptimizerField {
  enum class Kind : uint8_t { kTensor = 0, kInt = 1, kReal = 2, kBool = 3 };
  std::string name;
  Kind kind = Kind::kReal;
  at::Tensor tensor;  // kTensor; may be undefined (an unused buffer)
  int64_t integer = 0;
  double real = 0;
  bool flag = false;
};
using OptimizerFields = std::vector<OptimizerField>;

struct OptimizerSnapshot {
  // "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", or "archive:<type>" for an
  // optimizer kept as libtorch's own archive bytes.
  std::string type;
  struct Group {
    OptimizerFields options;
    // Per parameter of the group, in order; nullopt: no state yet.
    std::vector<std::optional<OptimizerFields>> state;
  };
  std::vector<Group> groups;
  std::string archive;  // libtorch archive bytes ("archive:" types only)
};

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

void write_fields(ByteWriter& w, const OptimizerFields& fields);
OptimizerFields read_fields(ByteReader& r, const c10::Device& device);
void write_optimizer(ByteWriter& w, const OptimizerSnapshot& s);
OptimizerSnapshot read_optimizer(ByteReader& r, const c10::Device& device);
void write_rng(ByteWriter& w, const RngState& s);
RngState read_rng(ByteReader& r);

// The calling process's generator states (CPU, and every CUDA device when
// libtorch has CUDA), and setting them back.
RngState capture_rng();
void restore_rng(const RngState& s, const std::string& source);

// Optimizer snapshots (checkpoint_optim.cc).
OptimizerSnapshot capture_optimizer(const torch::optim::Optimizer& optimizer);
// Validates against `optimizer` first, then applies; `source` names the
// checkpoint in errors.
void restore_optimizer(const OptimizerSnapshot& s,
                       torch::optim::Optimizer& optimizer,
                       const std::string& source);

}  // namespace detail
}  // namespace ddp
