#include "support/thread_world.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ddp::testing {

std::string unique_memory_url() {
  static std::atomic<int> counter{0};
  return "memory://world-" + std::to_string(counter++);
}

std::vector<std::exception_ptr> run_ranks_collect(
    int world_size, const std::function<void(int rank)>& fn,
    const ThreadWorldOptions& options) {
  std::string url = unique_memory_url();
  std::vector<std::exception_ptr> errors(world_size);
  // Groups are released only after every rank's fn has returned: a rank that
  // finished its last collective first must not close connections that a
  // slower rank still reads from.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ProcessGroupPtr group;
      try {
        InitOptions o;
        o.init_method = url;
        o.rank = r;
        o.world_size = world_size;
        o.timeout = options.timeout;
        o.backend = options.backend;
        o.shared_memory = options.shared_memory;
        o.shared_memory_staging_bytes = options.shared_memory_staging_bytes;
        group = new_process_group(o);
        DefaultGroupGuard guard(group);
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      std::unique_lock<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
      cv.wait(lock, [&] { return finished == world_size; });
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void run_ranks(int world_size, const std::function<void(int rank)>& fn,
               const ThreadWorldOptions& options) {
  for (auto& e : run_ranks_collect(world_size, fn, options)) {
    if (e) std::rethrow_exception(e);
  }
}

std::string message_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "(non-std exception)";
  }
}

}  // namespace ddp::testing
