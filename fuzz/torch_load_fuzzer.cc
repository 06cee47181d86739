// libFuzzer target: ddp::detail::parse_torch_state_dict (src/checkpoint/
// torch_load.cc, the reader of Python's torch.save files) and its restricted
// unpickler (src/checkpoint/unpickler.cc) on arbitrary bytes.
//
// A torch.save file is a zip whose records carry CRCs, so random mutations
// of a whole file mostly test the zip reader. Each input is therefore read
// twice:
//   1. as is (the seeds are real files from tests/golden/state_dict/);
//   2. as the pickle of an archive built here around it: data.pkl = the
//      input, with storage records data/0 .. data/15 of 256 bytes each, so
//      that mutated pickles reach the unpickler and the tensor rebuilding
//      (seeds: the data.pkl of the golden files, in fuzz/corpus/torch_load).
// Contract checked: bad input throws ddp::InvalidArgument naming the source
// (any other exception escapes and libFuzzer reports it); every tensor of a
// result lies inside its storage (it is read in full, under ASan).
// Run through scripts/fuzz.sh.
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/torch_load.h"
#include "ddp/error.h"

namespace {

const char kSource[] = "<fuzz input>";

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "torch_load_fuzzer: contract violated: %s\n", what);
  std::abort();
}

void parse_and_check(const std::string& bytes, const std::string& key) {
  try {
    auto state = ddp::detail::parse_torch_state_dict(bytes, kSource, key);
    double sum = 0;
    for (const auto& item : state) {
      sum += item.value().to(at::kDouble).sum().item<double>();  // reads every element
    }
    (void)sum;
  } catch (const ddp::InvalidArgument& e) {
    if (std::strstr(e.what(), kSource) == nullptr) violated("error message does not name the source");
  }
}

std::string archive_around(const uint8_t* pickle, size_t size) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle, size);
  std::vector<uint8_t> storage(256);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<uint8_t>(i);
  for (int k = 0; k < 16; ++k) {
    writer.writeRecord("data/" + std::to_string(k), storage.data(), storage.size());
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  parse_and_check(input, "");
  if (size < 4 || std::memcmp(data, "PK\x03\x04", 4) != 0) {
    const std::string zip = archive_around(data, size);
    parse_and_check(zip, "");
    parse_and_check(zip, "model");
  }
  return 0;
}
