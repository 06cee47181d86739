// An environment variable set, or unset, for a scope: the one environment
// override of the tests. The destructor puts back the value the variable
// had, or unsets it if it had none. Set it before the ranks (threads) start:
// setenv is not safe while another thread reads the environment.
//
//   ScopedEnv debug("DDP_DEBUG", "1");
//   ScopedEnv no_port = ScopedEnv::unset("MASTER_PORT");
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace ddp::testing {

class ScopedEnv {
 public:
  // Sets `name` to `value` (std::nullopt: unsets it).
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    put(value);
  }
  static ScopedEnv unset(std::string name) { return ScopedEnv(std::move(name), std::nullopt); }
  ~ScopedEnv() { put(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void put(const std::optional<std::string>& value) const {
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace ddp::testing
