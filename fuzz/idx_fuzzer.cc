// libFuzzer target: ddp::datasets::parse_idx on arbitrary bytes.
//
// Contract checked (include/ddp/datasets/idx.h):
//   - bad input throws ddp::InvalidArgument whose message starts with the
//     name given; any other exception escapes and libFuzzer reports it;
//   - memory is bounded by IdxOptions::max_bytes (a small limit here, so a
//     forged header or a gzip bomb that slipped through would show up as an
//     oversized tensor or an RSS/time-out);
//   - on success the tensor matches the header (dtype, shape, contiguous,
//     CPU), and for plain (not gzip) input, writing the result back as IDX
//     gives exactly the input bytes: the parser neither dropped nor invented
//     a byte; and with IdxOptions::expected_magic set to another magic
//     number, the same input is refused.
// Run through scripts/fuzz.sh; seeds in fuzz/corpus/idx.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ddp/datasets/idx.h"
#include "ddp/error.h"
#include "idx_encode.h"

namespace {

constexpr size_t kMaxBytes = size_t{1} << 20;
const char kName[] = "<fuzz input>";

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "idx_fuzzer: contract violated: %s\n", what);
  std::abort();
}

at::ScalarType expected_type(ddp::datasets::IdxDtype d) {
  using ddp::datasets::IdxDtype;
  switch (d) {
    case IdxDtype::kUInt8: return at::kByte;
    case IdxDtype::kInt8: return at::kChar;
    case IdxDtype::kInt16: return at::kShort;
    case IdxDtype::kInt32: return at::kInt;
    case IdxDtype::kFloat32: return at::kFloat;
    case IdxDtype::kFloat64: return at::kDouble;
  }
  violated("dtype outside IdxDtype");
}

void check_result(const ddp::datasets::IdxArray& a, const uint8_t* data, size_t size) {
  const at::Tensor& t = a.tensor;
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) violated("tensor not CPU-contiguous");
  if (t.scalar_type() != expected_type(a.dtype)) violated("tensor dtype differs from the header");
  if (t.sizes().vec() != a.dims) violated("tensor shape differs from the header's sizes");
  if ((a.magic & 0xff) != a.dims.size() || ((a.magic >> 8) & 0xff) != static_cast<uint32_t>(a.dtype)) {
    violated("magic number disagrees with dtype or dims");
  }
  const size_t nbytes = static_cast<size_t>(t.numel()) * ddp::datasets::element_size(a.dtype);
  if (nbytes > kMaxBytes) violated("payload above IdxOptions::max_bytes accepted");
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gzip) {
    const std::string again = ddp::fuzz::encode_idx(a);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
      violated("plain input does not round-trip");
    }
  }
}

void check_message(const ddp::InvalidArgument& e) {
  if (std::strncmp(e.what(), kName, sizeof kName - 1) != 0) violated("error message does not name the input");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ddp::datasets::IdxOptions options;
  options.max_bytes = kMaxBytes;
  try {
    const ddp::datasets::IdxArray a = ddp::datasets::parse_idx(data, size, kName, options);
    check_result(a, data, size);
    // The same file where another magic number is expected must be refused.
    options.expected_magic = a.magic ^ 1u;
  } catch (const ddp::InvalidArgument& e) {
    check_message(e);
    return 0;
  }
  try {
    ddp::datasets::parse_idx(data, size, kName, options);
    violated("a file with another magic number than expected_magic accepted");
  } catch (const ddp::InvalidArgument& e) {
    check_message(e);
  }
  return 0;
}
