// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction: the one temporary directory of the tests.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "compat/filesystem_compat.h"

namespace ddp::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ddp-test") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    compat::remove_tree(path_, ec);  // Note [remove_all and libtorch 2.11]
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ddp::testing
