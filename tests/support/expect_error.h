// Test support: `f()` must throw E (InvalidArgument by default) whose
// message contains `text`; otherwise a failure of the calling test naming
// what came instead.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ddp/error.h"

namespace ddp::testing {

template <typename E = InvalidArgument>
void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error with: " << text;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

}  // namespace ddp::testing
