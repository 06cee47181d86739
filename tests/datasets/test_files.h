// Helpers for the dataset tests: crafted IDX files (plain or gzip) and the
// Python oracle; the temporary directory is support/temp_dir.h's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace ddp {
namespace testing {

// An IDX file: big-endian magic, sizes, then `payload` as given.
std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& payload);

// `data` gzip-compressed (one member, with CRC and length trailer).
std::string gzip(const std::string& data);

void write_file(const std::string& path, const std::string& bytes);

// Runs `script` with the oracle Python (support/oracle.h) under a
// 120 s timeout and returns its stdout; fails the test (ADD_FAILURE) and
// returns "" if it exits non-zero.
std::string run_python(const std::string& script);

}  // namespace testing
}  // namespace ddp
