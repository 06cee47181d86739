// Test support: runs N ranks as N threads of this process, each with its own
// ProcessGroup over an in-process (memory://) store, installed as the
// thread's default group (DefaultGroupGuard). Fast: no processes, no ports.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp::testing {

// Options for the groups the harness creates. timeout bounds every test's
// collectives so that a broken test fails instead of hanging.
struct ThreadWorldOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  std::string backend = "gloo";
  // InitOptions' fields of the same names (DDP_SHM=0 still turns it off:
  // CTest runs the DDP and collective suites once more that way).
  bool shared_memory = true;
  size_t shared_memory_staging_bytes = 0;
};

// Runs fn(rank) on world_size threads and joins them all. Returns each
// rank's exception (null where the rank finished normally).
std::vector<std::exception_ptr> run_ranks_collect(
    int world_size, const std::function<void(int rank)>& fn,
    const ThreadWorldOptions& options = {});

// As run_ranks_collect, then rethrows the lowest rank's exception, if any.
void run_ranks(int world_size, const std::function<void(int rank)>& fn,
               const ThreadWorldOptions& options = {});

// The message of an exception_ptr ("" for null), and its dynamic type check.
std::string message_of(const std::exception_ptr& e);
template <typename E>
bool is_a(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
  }
  return false;
}

// A unique memory:// init method name for one world.
std::string unique_memory_url();

}  // namespace ddp::testing
