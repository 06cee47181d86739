#include "launcher/worker_group.h"

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>

#include "ddp/error.h"
#include "launcher/group_support.h"
#include "launcher/relay.h"
#include "launcher/spawn.h"
#include "launcher/summary.h"

extern char** environ;

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long SIGKILLed processes get to disappear before we stop waiting.
constexpr milliseconds kGiveUpAfterKill{10000};
// How long output may trail the last process of the group.
constexpr milliseconds kDrainTime{1000};

struct Worker {
  WorkerResult result;
  std::vector<OutputStream> streams;  // [0] stdout, [1] stderr
  bool reaped = false;
  bool signalled = false;  // ddprun sent it a stop signal
  uint64_t sent = 0;       // the signals ddprun sent it, bit 1 << signal
};

class GroupRun {
 public:
  GroupRun(const GroupSpec& spec, SignalWatch& signals, GroupController* ctl)
      : spec_(spec), o_(*spec.options), signals_(signals), ctl_(ctl) {}

  GroupResult run() {
    start_all();
    wait_loop();
    finish();
    return std::move(result_);
  }

 private:
  void start_all();
  void start_one(int local_rank, bool prefix);
  void wait_loop();
  bool wind_down(Clock::time_point now);
  void poll_once(int timeout_ms);
  int sleep_ms(Clock::time_point now) const;
  void on_signal(int sig);
  void reap();
  void on_worker_end(std::size_t index, int status);
  void stop_all(int sig);
  void signal_groups(int sig);
  void finish();

  const GroupSpec& spec_;
  const LaunchOptions& o_;
  SignalWatch& signals_;
  GroupController* ctl_;
  std::vector<Worker> workers_;
  GroupResult result_;
  std::optional<Clock::time_point> kill_at_;     // SIGKILL deadline
  std::optional<Clock::time_point> give_up_at_;  // after SIGKILL
  std::optional<Clock::time_point> drain_until_;
  bool leftovers_signalled_ = false;
};

void GroupRun::start_all() {
  const bool prefix = ranks_on_console(o_) > 1;
  workers_.reserve(static_cast<std::size_t>(o_.nproc_per_node));
  try {
    for (int lr = 0; lr < o_.nproc_per_node; ++lr) start_one(lr, prefix);
  } catch (...) {
    signal_groups(SIGKILL);
    for (Worker& w : workers_) waitpid(w.result.pid, nullptr, 0);
    throw;
  }
}

void GroupRun::start_one(int local_rank, bool prefix) {
  const std::string dir = fmt::format("{}/{}", spec_.attempt_dir, local_rank);
  make_directories(dir);
  const std::string error_file = dir + "/error.json";
  ::unlink(error_file.c_str());  // a stale one would blame this attempt
  StreamRoute out_route = stream_route(o_, local_rank, kStdOut, prefix, dir,
                                       spec_.log_all_streams);
  WorkerConsole console;
  console.launcher_prefixes_lines = prefix;
  // The worker's stdout is a pipe, but what it writes may reach a terminal
  // (Note [Carriage-return updates]).
  console.stdout_reaches_terminal = out_route.terminal;
  WorkerCommand cmd;
  cmd.path = spec_.program_path;
  cmd.argv = worker_arguments(o_, local_rank);
  cmd.env = worker_environment(o_, local_rank, spec_.attempt, error_file, environ, console);
  cmd.stdin_null = isatty(STDIN_FILENO) != 0;  // workers are not in the
                                               // terminal's foreground group
  SpawnedWorker sp = spawn_worker(cmd);
  Worker& w = workers_.emplace_back();
  w.result.local_rank = local_rank;
  w.result.rank = o_.global_rank(local_rank);
  w.result.pid = sp.pid;
  try {
    w.streams.emplace_back(sp.stdout_fd, std::move(out_route));
  } catch (...) {
    ::close(sp.stderr_fd);
    throw;
  }
  w.streams.emplace_back(sp.stderr_fd, stream_route(o_, local_rank, kStdErr, prefix,
                                                    dir, spec_.log_all_streams));
}

void GroupRun::wait_loop() {
  while (true) {
    const auto now = Clock::now();
    if (wind_down(now)) return;
    if (kill_at_ && now >= *kill_at_ && !give_up_at_) {
      signal_groups(SIGKILL);
      give_up_at_ = now + kGiveUpAfterKill;
    }
    if (give_up_at_ && now >= *give_up_at_) {
      launcher_message("some worker processes did not end after SIGKILL; giving up on them");
      return;
    }
    poll_once(sleep_ms(now));
  }
}

// After the last worker: stop what they left behind, then let the output
// drain. Returns true when the attempt is over.
bool GroupRun::wind_down(Clock::time_point now) {
  bool all_reaped = std::all_of(workers_.begin(), workers_.end(),
                                [](const Worker& w) { return w.reaped; });
  if (!all_reaped) return false;
  std::vector<pid_t> groups;
  for (const Worker& w : workers_) groups.push_back(w.result.pid);
  if (any_group_alive(groups)) {
    if (!leftovers_signalled_) {
      leftovers_signalled_ = true;
      signal_groups(SIGTERM);
      if (!kill_at_) kill_at_ = now + milliseconds(static_cast<long>(o_.grace_period * 1000));
    }
    return false;
  }
  if (!drain_until_) {
    // Helpers that left their worker's group would hold the output pipes
    // open: they go now, then the output drains.
    kill_stray_children();
    drain_until_ = now + kDrainTime;
  }
  bool open = false;
  for (const Worker& w : workers_) {
    for (const OutputStream& s : w.streams) open = open || s.is_open();
  }
  return !open || now >= *drain_until_;
}

int GroupRun::sleep_ms(Clock::time_point now) const {
  long ms = static_cast<long>(o_.monitor_interval * 1000);
  auto until = [&](const std::optional<Clock::time_point>& t) {
    if (t) {
      long left = std::chrono::duration_cast<milliseconds>(*t - now).count();
      ms = std::min(ms, std::max(0L, left) + 1);
    }
  };
  until(kill_at_);
  until(give_up_at_);
  until(drain_until_);
  if (leftovers_signalled_) ms = std::min(ms, 50L);  // group members are
                                                     // not all our children
  if (ctl_) ms = std::min(ms, static_cast<long>(ctl_->max_sleep_ms()));
  return static_cast<int>(std::max(1L, ms));
}

void GroupRun::poll_once(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<OutputStream*> streams;
  fds.push_back({signals_.fd(), POLLIN, 0});
  for (Worker& w : workers_) {
    for (OutputStream& s : w.streams) {
      if (!s.is_open()) continue;
      fds.push_back({s.fd(), POLLIN, 0});
      streams.push_back(&s);
    }
  }
  if (ctl_) ctl_->add_poll_fds(fds);
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0 && errno != EINTR) {
    throw Error(fmt::format("ddprun: poll failed: {}", std::strerror(errno)));
  }
  for (std::size_t i = 0; i < streams.size(); ++i) {
    if (fds[i + 1].revents != 0) streams[i]->read_available();
  }
  for (int sig : signals_.read_pending()) on_signal(sig);
  if (ctl_) {
    if (auto reason = ctl_->service(); reason && result_.outcome == GroupOutcome::kSucceeded) {
      result_.outcome = GroupOutcome::kStopped;
      result_.stop_reason = *reason;
      stop_all(SIGTERM);
    }
  }
}

void GroupRun::on_signal(int sig) {
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  if (!is_stop_signal(sig)) return;
  if (result_.interrupt_signal != 0 || kill_at_) {
    launcher_message(fmt::format("{} again: killing every worker now", signal_name(sig)));
    if (result_.interrupt_signal == 0) result_.interrupt_signal = sig;
    signal_groups(SIGKILL);
    if (!give_up_at_) give_up_at_ = Clock::now() + kGiveUpAfterKill;
    return;
  }
  launcher_message(fmt::format("got {}: passing it to every worker (again to kill at once)",
                               signal_name(sig)));
  if (ctl_) ctl_->on_interrupt(sig);
  result_.interrupt_signal = sig;
  if (result_.outcome == GroupOutcome::kSucceeded) result_.outcome = GroupOutcome::kInterrupted;
  stop_all(sig);
}

void GroupRun::reap() {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // 0: none ended; -1: no children left
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].result.pid == pid && !workers_[i].reaped) on_worker_end(i, status);
    }
  }
}

void GroupRun::on_worker_end(std::size_t index, int status) {
  Worker& w = workers_[index];
  WorkerResult& r = w.result;
  w.reaped = true;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.end_time = wall_clock_seconds();
  for (OutputStream& s : w.streams) s.drain();  // its last words
  const bool ok = WIFEXITED(status) && r.exit_code == 0;
  // A worker killed by a signal ddprun did not send (SIGSEGV, SIGABRT while
  // it was being stopped) died of its own cause, and is reported with it.
  const bool own_signal =
      WIFSIGNALED(status) && (r.signal >= 64 || !(w.sent & (uint64_t{1} << r.signal)));
  r.end = w.signalled && !own_signal ? WorkerEnd::kStopped
          : ok                       ? WorkerEnd::kSucceeded
                                     : WorkerEnd::kFailed;
  if (r.end != WorkerEnd::kFailed || result_.outcome != GroupOutcome::kSucceeded) return;
  result_.outcome = GroupOutcome::kFailed;
  result_.root_cause = static_cast<int>(index);
  if (ctl_) {
    WorkerResult copy = r;
    copy.stderr_tail = w.streams[1].tail();
    copy.error_file = existing_error_file(spec_.attempt_dir, r.local_rank);
    ctl_->on_local_failure(copy);
  }
  stop_all(SIGTERM);
}

void GroupRun::stop_all(int sig) {
  signal_groups(sig);
  if (!kill_at_) {
    kill_at_ = Clock::now() + milliseconds(static_cast<long>(o_.grace_period * 1000));
  }
}

void GroupRun::signal_groups(int sig) {
  for (Worker& w : workers_) {
    ::kill(-w.result.pid, sig);  // ESRCH once the group is empty: fine
    if (!w.reaped && sig != SIGCHLD) {
      w.signalled = true;
      if (sig > 0 && sig < 64) w.sent |= uint64_t{1} << sig;
    }
  }
}

void GroupRun::finish() {
  for (Worker& w : workers_) {
    for (OutputStream& s : w.streams) s.close();
    w.result.stderr_tail = w.streams[1].tail();
    w.result.error_file = existing_error_file(spec_.attempt_dir, w.result.local_rank);
    read_error_facts(w.result);
    result_.workers.push_back(w.result);
  }
  if (result_.outcome == GroupOutcome::kFailed) {
    result_.root_cause = pick_root_cause(result_.workers, result_.root_cause);
  }
  kill_stray_children();
}

}  // namespace

int ranks_on_console(const LaunchOptions& o) {
  int n = 0;
  for (int lr = 0; lr < o.nproc_per_node; ++lr) {
    bool shown = !o.local_ranks_filter || o.local_ranks_filter->count(lr) > 0;
    if (shown && o.redirects.for_rank(lr) != kStdAll) ++n;
  }
  return n;
}

GroupResult run_worker_group(const GroupSpec& spec, SignalWatch& signals,
                             GroupController* controller) {
  GroupRun run(spec, signals, controller);
  return run.run();
}

}  // namespace ddp::launcher
