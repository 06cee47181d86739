#include "test_files.h"

#include "support/oracle.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace ddp {
namespace testing {

std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string out;
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  return out + payload;
}

std::string gzip(const std::string& data) {
  z_stream z{};
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(&out[0]);
  z.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate failed");
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string run_python(const std::string& script) {
  TempDir dir;
  const std::string file = dir.file("oracle.py");
  write_file(file, script);
  std::FILE* p = popen(("timeout 120 " + ddp::testing::oracle_python() + " " + file).c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot start " << ddp::testing::oracle_python();
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << ddp::testing::oracle_python() << " failed (status " << status << ") on:\n" << script;
    return "";
  }
  return out;
}

}  // namespace testing
}  // namespace ddp
