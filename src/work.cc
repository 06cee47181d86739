// Starting c10d operations, waiting for them, and translating their errors
// into ddp's error types (docs/errors.md).
#include <fmt/format.h>
#include <fmt/ranges.h>


#include <algorithm>
#include <cctype>
#include <string_view>
#include <thread>

#include "call_scope.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "work.h"

namespace ddp {
namespace detail {
namespace {

thread_local int64_t t_step = -1;  // BucketScope
thread_local int t_bucket = -1;

// An event's reason for the flight record: its first 300 characters (the
// record keeps 808 bytes for all its events).
std::string event_text(const std::string& message) {
  if (message.size() <= 300) return message;
  return fmt::format("{}...", std::string_view(message).substr(0, 297));
}

// Note [Call labels]: the innermost library call, else DDP's bucket.
std::string in_call() {
  if (const char* call = current_call()) return fmt::format(" in {}", call);
  if (t_bucket >= 0) return fmt::format(" in DDP backward (step {}, bucket {})", t_step, t_bucket);
  return "";
}

bool contains_ci(std::string haystack, const std::string& needle) {
  std::transform(haystack.begin(), haystack.end(), haystack.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

BucketScope::BucketScope(int64_t step, int bucket)
    : previous_step_(t_step), previous_bucket_(t_bucket) {
  t_step = step;
  t_bucket = bucket;
}
BucketScope::~BucketScope() {
  t_step = previous_step_;
  t_bucket = previous_bucket_;
}

void rethrow_as_comm_error(const std::string& what) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = compat::what_without_backtrace(e);
    if (msg.find("the ranks are out of step") != std::string::npos) {
      throw MismatchError(fmt::format("{} failed: {}", what, msg));  // shm/shm_protocol.cc
    }
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

c10::intrusive_ptr<c10d::Work> backend_all_reduce(ProcessGroupImpl& group,
                                                  compat::Backend& backend,
                                                  std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& options) {
  if (group.shm && tensors.size() == 1 &&
      shm::ShmGroup::supports(tensors[0], options.reduceOp)) {
    return group.shm->all_reduce(tensors[0], options.reduceOp, options.timeout);
  }
  return backend.allreduce(tensors, options);
}

c10::intrusive_ptr<c10d::Work> backend_broadcast(ProcessGroupImpl& group,
                                                 compat::Backend& backend,
                                                 std::vector<at::Tensor>& tensors,
                                                 const c10d::BroadcastOptions& options) {
  if (group.shm && tensors.size() == 1 &&
      shm::ShmGroup::supports(tensors[0], c10d::ReduceOp::SUM)) {
    // Local ranks are global ranks on a single host (ShmGroup::broadcast).
    auto work = group.shm->broadcast(tensors[0], static_cast<int>(options.rootRank),
                                     options.timeout);
    if (work) return work;
  }
  return backend.broadcast(tensors, options);
}

ProcessGroupPtr resolve_group_ptr(const CollectiveOptions& options) {
  ProcessGroupPtr g = options.group ? options.group : default_group();
  if (g->impl().rank < 0) throw InvalidArgument(g->impl().not_member);  // new_group
  return g;
}

ProcessGroup& resolve_group(const CollectiveOptions& options) {
  return *resolve_group_ptr(options);
}

std::shared_ptr<WorkImpl> start_work(
    const CollectiveOptions& options, const std::string& op,
    const std::function<c10::intrusive_ptr<c10d::Work>(
        compat::Backend&, std::chrono::milliseconds)>& start,
    const std::function<std::string()>& fingerprint) {
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
  w->seq = g.next_seq++;
  w->what = g.describe(op, w->seq);
  w->in_call = in_call();
  w->advice = current_call_advice();
  w->timeout = timeout;
  w->on_device = g.backend_name == "nccl";
  if (t_step >= 0) g.monitor_step(t_step);
  const bool debug = g.monitor && g.monitor->debug();
  const std::string signature = (g.flight || debug) && fingerprint ? fingerprint() : op;
  if (g.flight) w->flight_id = g.flight->started(w->seq, op, signature, g.step.load(), t_bucket);
  try {
    if (g.monitor) {
      g.monitor->started(w->seq, w->what + w->in_call);
      if (debug) g.monitor->check_consistency(w->seq, w->what, signature, timeout);
    }
    w->work = start(*g.backend, timeout);
  } catch (...) {
    if (g.monitor) g.monitor->finished(w->seq);
    try {
      rethrow_as_comm_error(w->what);
    } catch (const std::exception& e) {
      w->record_end(dynamic_cast<const TimeoutError*>(&e) ? flight::State::kTimedOut
                                                          : flight::State::kFailed,
                    e.what());
      throw;
    }
  }
  return w;
}

std::shared_ptr<WorkImpl> start_point_to_point(
    const CollectiveOptions& options, const std::string& op,
    const std::function<c10::intrusive_ptr<c10d::Work>(
        compat::Backend&, std::chrono::milliseconds)>& start) {
  ProcessGroupPtr group = resolve_group_ptr(options);
  ProcessGroupImpl& g = group->impl();
  auto timeout = options.timeout.value_or(g.timeout);
  if (timeout.count() <= 0) {
    throw InvalidArgument(fmt::format(
        "{}: CollectiveOptions::timeout must be > 0 (got {} ms)", op, timeout.count()));
  }
  auto w = std::make_shared<WorkImpl>();
  w->group = group;
  w->collective = false;
  w->seq = g.next_p2p_seq++;
  w->what = fmt::format("{} (point-to-point #{}) on rank {} of {} ({})", op, w->seq, g.rank,
                        g.size, g.backend_name);
  w->in_call = in_call();
  w->advice = current_call_advice();
  w->timeout = timeout;
  w->on_device = g.backend_name == "nccl";
  try {
    w->work = start(*g.backend, timeout);
  } catch (...) {
    rethrow_as_comm_error(w->what);
  }
  return w;
}

// Waits in slices of the stall-warning threshold: each slice that expires
// logs who has not reached this collective (Note [Progress publication]);
// the timeout raises with the same facts.
void WorkImpl::wait_with_stall_reports() {
  if (!work) return;
  CollectiveMonitor* monitor = monitor_or_null();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  while (true) {
    auto now = std::chrono::steady_clock::now();
    auto slice = deadline - now;
    if (monitor) slice = std::min<std::chrono::steady_clock::duration>(slice, monitor->warn_after());
    if (on_device) {
      if (completed_within(slice)) return;
    } else {
      try {
        work->wait(std::chrono::duration_cast<std::chrono::milliseconds>(slice));
        return;
      } catch (const std::exception&) {
        if (work->isCompleted()) throw;  // the operation itself failed
      }
    }
    now = std::chrono::steady_clock::now();
    double waited = std::chrono::duration<double>(now - start).count();
    std::string report = monitor ? monitor->stall_report(seq) : "";
    if (now + std::chrono::milliseconds(50) >= deadline) {  // waits may wake a bit early
      throw TimeoutError(fmt::format(
          "{} timed out after {:.1f} s{}{}{}. A rank may have stopped, crashed, or skipped this "
          "collective{}{}",
          what, waited, in_call, report.empty() ? "" : ": ", report, advice ? ". " : "",
          advice ? advice : ""));
    }
    // Through ddp's logging: the rank prefix (or ddprun's), DDP_LOG_LEVEL.
    const std::string warning = fmt::format("{} has waited {:.0f} s{}{}{}", what, waited, in_call,
                                            report.empty() ? "" : ": ", report);
    ddp::log(LogLevel::kWarning, "ddp: " + warning);
    auto& flight = group->impl().flight;
    if (flight && !stall_noted) {
      stall_noted = true;
      flight->note_event(event_text("stall: " + warning).c_str());
    }
  }
}

// Polls, sleeping 50 us growing to 1 ms: a device collective completes
// when its kernel does, which no host call waits for with a bound.
bool WorkImpl::completed_within(std::chrono::steady_clock::duration slice) {
  const auto deadline = std::chrono::steady_clock::now() + slice;
  auto nap = std::chrono::microseconds(50);
  while (!work->isCompleted()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
  if (std::exception_ptr e = work->exception()) std::rethrow_exception(e);
  return true;
}

CollectiveMonitor* WorkImpl::monitor_or_null() const {
  return collective ? group->impl().monitor.get() : nullptr;
}

void WorkImpl::record_end(flight::State state, const char* reason) {
  auto& flight = group->impl().flight;
  if (!flight || !collective) return;
  flight->ended(flight_id, state);
  if (reason != nullptr) flight->note_event(event_text(reason).c_str());
}

// A peer's connection closed: if it left last words before dying (Note
// [Last words]), they name the cause; ranks out of step are a MismatchError
// here too, so every rank reports the same thing.
std::exception_ptr WorkImpl::with_last_words(const CommError& e) const {
  CollectiveMonitor* monitor = monitor_or_null();
  std::string notes = monitor ? monitor->fatal_notes(std::chrono::milliseconds(1500)) : "";
  if (notes.empty()) return std::make_exception_ptr(e);
  if (notes.find("the ranks are out of step") != std::string::npos) {
    return std::make_exception_ptr(MismatchError(fmt::format(
        "{} failed because another rank failed first: {}", what, notes)));
  }
  return std::make_exception_ptr(CommError(fmt::format("{}. It failed first: {}", e.what(), notes)));
}

// A backend timeout, with who had not arrived (when not already said).
std::string WorkImpl::with_stall_report(const std::string& message) const {
  CollectiveMonitor* monitor = monitor_or_null();
  if (!monitor || message.find("has not reached it") != std::string::npos) return message;
  std::string report = monitor->stall_report(seq);
  return report.empty() ? message : message + ". " + report;
}

// Inside a catch block: keeps the operation's error, translated, and ends
// its flight record and its place in the stall inspector.
void WorkImpl::finish_with_error() {
  try {
    rethrow_as_comm_error(what);
  } catch (const TimeoutError& e) {
    group->impl().abandon();
    // Note [Call labels]: which library call it was, and its advice (once:
    // ddp's own deadline, wait_with_stall_reports, has said both already).
    const std::string what = e.what();
    std::string call;
    if (!in_call.empty() && what.find(in_call) == std::string::npos) {
      call = fmt::format(". It was started{}", in_call);
    }
    if (advice && what.find(advice) == std::string::npos) call += fmt::format(". {}", advice);
    TimeoutError full(with_stall_report(what) + call);
    record_end(flight::State::kTimedOut, full.what());
    error = std::make_exception_ptr(full);
  } catch (const CommError& e) {
    group->impl().abandon();
    error = with_last_words(e);
    record_end(flight::State::kFailed, e.what());
  } catch (const std::exception& e) {
    error = std::current_exception();
    record_end(flight::State::kFailed, e.what());
  } catch (...) {
    error = std::current_exception();
    record_end(flight::State::kFailed, "unknown exception");
  }
  finished = true;
  done.store(true);
  if (auto* monitor = monitor_or_null()) monitor->finished(seq);
}

// The stream half of a device operation (Note [Device waits]): c10d's wait()
// with blocking wait off makes the current stream wait and returns; the
// continuation is queued on that stream after it.
void WorkImpl::wait_stream() {
  if (!on_device) return wait();
  std::lock_guard<std::mutex> lock(mu);
  if (!finished && !stream_waited) {
    try {
      if (work) work->wait();  // no timeout: c10d would block the host with one
      if (then && !then_on_host) then();
      stream_waited = true;
    } catch (...) {
      finish_with_error();
    }
  }
  if (error) std::rethrow_exception(error);
}

void WorkImpl::wait() {
  std::lock_guard<std::mutex> lock(mu);
  if (!finished) {
    try {
      if (on_device) {
        if (!stream_waited) {
          if (work) work->wait();  // no timeout: c10d would block the host with one
          if (then && !then_on_host) then();
          stream_waited = true;
        }
        wait_with_stall_reports();
        if (then && then_on_host) then();
      } else {
        wait_with_stall_reports();
        if (then) then();
      }
      record_end(flight::State::kCompleted, nullptr);
      finished = true;
      done.store(true);
      if (auto* monitor = monitor_or_null()) monitor->finished(seq);
    } catch (...) {
      finish_with_error();
    }
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
