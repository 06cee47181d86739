// libFuzzer target: ddp::detail::parse_checkpoint on arbitrary bytes.
//
// A checkpoint file is framed: magic, version, flags, payload, then the
// payload's length and CRC-32 and an end marker (include/ddp/checkpoint.h).
// Random mutations almost never keep the CRC right, so the fuzzer would
// only ever test the frame. Each input is therefore parsed twice:
//   1. as is: the frame checks;
//   2. re-framed with a correct length and CRC: the payload parser. When the
//      input is itself a checkpoint file (it starts with the magic and is
//      long enough), its payload is re-framed, so mutations of the seeds
//      (real files written by serialize_checkpoint) reach the payload parser;
//      otherwise the whole input is taken as the payload.
// Contract checked: bad input throws ddp::InvalidArgument naming the source
// (any other exception escapes and libFuzzer reports it); a checkpoint that
// parses serializes to bytes that parse again to the same serialization.
// Run through scripts/fuzz.sh; seeds in fuzz/corpus/checkpoint.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "checkpoint/checkpoint_format.h"
#include "ddp/checkpoint.h"
#include "ddp/error.h"

namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '\n'};
constexpr char kEndMagic[8] = {'D', 'D', 'P', 'E', 'N', 'D', '\n', '\0'};
constexpr size_t kHeaderBytes = 16;   // magic, u32 version, u32 flags
constexpr size_t kTrailerBytes = 20;  // u64 length, u32 CRC-32, end magic
const char kSource[] = "<fuzz input>";

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "checkpoint_fuzzer: contract violated: %s\n", what);
  std::abort();
}

template <typename T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);  // little-endian host
}

std::string frame(const char* payload, size_t size) {
  std::string out(kMagic, sizeof kMagic);
  append<uint32_t>(out, ddp::kCheckpointFormatVersion);
  append<uint32_t>(out, 0);
  out.append(payload, size);
  append<uint64_t>(out, size);
  append<uint32_t>(out, static_cast<uint32_t>(
                            crc32(0L, reinterpret_cast<const Bytef*>(payload), static_cast<uInt>(size))));
  out.append(kEndMagic, sizeof kEndMagic);
  return out;
}

void parse_and_check(const std::string& bytes) {
  std::string first;
  try {
    first = ddp::detail::serialize_checkpoint(ddp::detail::parse_checkpoint(bytes, kSource));
  } catch (const ddp::InvalidArgument& e) {
    if (std::strstr(e.what(), kSource) == nullptr) violated("error message does not name the source");
    return;
  }
  // What the loader accepts, the writer must write and the loader read back.
  const std::string second = ddp::detail::serialize_checkpoint(ddp::detail::parse_checkpoint(first, kSource));
  if (first != second) violated("serialize(parse(x)) is not stable");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  parse_and_check(input);
  const bool is_file = size >= kHeaderBytes + kTrailerBytes && std::memcmp(data, kMagic, sizeof kMagic) == 0;
  if (is_file) {
    parse_and_check(frame(input.data() + kHeaderBytes, size - kHeaderBytes - kTrailerBytes));
  } else {
    parse_and_check(frame(input.data(), size));
  }
  return 0;
}
