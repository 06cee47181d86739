// Starting c10d operations, waiting for them, and translating their errors
// into ddp's error types (docs/errors.md).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "ddp/error.h"
#include "process_group_impl.h"

namespace ddp {
namespace detail {
namespace {

bool contains_ci(std::string haystack, const std::string& needle) {
  std::transform(haystack.begin(), haystack.end(), haystack.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

void rethrow_as_comm_error(const std::string& what) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = compat::what_without_backtrace(e);
    if (contains_ci(msg, "timed out") || contains_ci(msg, "timeout")) {
      throw TimeoutError(fmt::format(
          "{} timed out: {}. A rank may have stopped, crashed, or skipped "
          "this collective",
          what, msg));
    }
    std::string hint;
    if (contains_ci(msg, "closed by peer") || contains_ci(msg, "reset by peer") ||
        contains_ci(msg, "broken pipe")) {
      hint = " (a peer rank closed its connection: it probably crashed or exited)";
    }
    throw CommError(fmt::format("{} failed: {}{}", what, msg, hint));
  }
}

ProcessGroupPtr resolve_group_ptr(const CollectiveOptions& options) {
  return options.group ? options.group : default_group();
}

ProcessGroup& resolve_group(const CollectiveOptions& options) {
  return options.group ? *options.group : *default_group();
}

std::shared_ptr<WorkImpl> start_work(
    const CollectiveOptions& options, const std::string& op,
    const std::function<c10::intrusive_ptr<c10d::Work>(
        compat::Backend&, std::chrono::milliseconds)>& start) {
  ProcessGroupPtr group = resolve_group_ptr(options);
  ProcessGroupImpl& g = group->impl();
  auto timeout = options.timeout.value_or(g.timeout);
  if (timeout.count() <= 0) {
    throw InvalidArgument(fmt::format(
        "{}: CollectiveOptions::timeout must be > 0 (got {} ms)", op,
        timeout.count()));
  }
  auto w = std::make_shared<WorkImpl>();
  w->group = group;
  w->what = g.describe(op, g.next_seq++);
  w->timeout = timeout;
  try {
    w->work = start(*g.backend, timeout);
  } catch (...) {
    rethrow_as_comm_error(w->what);
  }
  return w;
}

void WorkImpl::wait() {
  std::lock_guard<std::mutex> lock(mu);
  if (!finished) {
    try {
      if (work) work->wait(timeout);
      if (then) then();
    } catch (...) {
      try {
        rethrow_as_comm_error(what);
      } catch (...) {
        error = std::current_exception();
      }
    }
    finished = true;
    done.store(true);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

Work::Work(std::shared_ptr<detail::WorkImpl> impl) : impl_(std::move(impl)) {}

void Work::wait() {
  if (!impl_) throw InvalidArgument("Work::wait() on an empty Work handle");
  impl_->wait();
}

bool Work::is_completed() const {
  if (!impl_) return true;
  return impl_->done.load() || !impl_->work || impl_->work->isCompleted();
}

}  // namespace ddp
