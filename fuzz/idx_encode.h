// Fuzzing helper: writes an IdxArray back as IDX bytes (big-endian header
// and elements), the inverse of ddp::datasets::parse_idx for plain input.
// The IDX fuzzer uses it as its oracle; make_seeds.cc to write seeds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "ddp/datasets/idx.h"

namespace ddp {
namespace fuzz {

inline void append_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// The tensor must be CPU and contiguous (parse_idx's results are).
inline std::string encode_idx(const datasets::IdxArray& a) {
  std::string out;
  append_be32(out, a.magic);
  for (int64_t d : a.dims) append_be32(out, static_cast<uint32_t>(d));
  const size_t elem = datasets::element_size(a.dtype);
  const auto* p = static_cast<const char*>(a.tensor.data_ptr());
  for (int64_t i = 0; i < a.tensor.numel(); ++i, p += elem) {
    std::string e(p, elem);
    std::reverse(e.begin(), e.end());  // little-endian host -> big-endian
    out += e;
  }
  return out;
}

}  // namespace fuzz
}  // namespace ddp
