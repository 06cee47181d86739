// One attempt of the local worker group: start nproc_per_node workers, relay
// their output, watch them, and stop them all when one fails, when ddprun is
// signalled, or when another node says so. Returns once every worker and
// everything they started has ended.
//
// Failure policy (as torchrun): the first worker to exit non-zero or by a
// signal is the root cause; the others get SIGTERM (to their whole process
// group), then SIGKILL after options.grace_period seconds. A stop signal
// (SIGINT, SIGTERM, SIGHUP, SIGQUIT) to ddprun is forwarded as is; a second
// one sends SIGKILL at once.
//
// Time bounds: after a failure or signal the call returns within
// grace_period + ~1 s (+ 10 s if a process ignores SIGKILL, e.g. stuck in
// the kernel, after which it is reported as still running).
//
// Thread safety: run on the launcher's main thread (see spawn.h).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/signals.h"
#include "launcher/worker_env.h"

namespace ddp::launcher {

enum class WorkerEnd {
  kRunning,    // had not ended (only if it survived SIGKILL)
  kSucceeded,  // exit code 0
  kFailed,     // non-zero exit or a signal, not caused by ddprun
  kStopped,    // ended after ddprun signalled it
};

struct WorkerResult {
  int local_rank = 0;
  int rank = 0;  // global rank
  pid_t pid = 0;
  WorkerEnd end = WorkerEnd::kRunning;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal killed it
  double end_time = 0;  // seconds since the epoch
  std::vector<std::string> stderr_tail;  // its last stderr lines
  std::string error_file;  // TORCHELASTIC_ERROR_FILE if the worker wrote it
  // From the error file (ddp programs write both): when the error was
  // recorded (seconds since the epoch, 0: no error file or no time), and
  // whether it followed the loss of a peer (Note [Root cause]).
  double error_time = 0;
  bool lost_peer = false;
  // How it follows another rank's failure, for the summary ("it lost its
  // connection to a failed rank"); "" when unknown.
  std::string consequence;
};

enum class GroupOutcome {
  kSucceeded,    // every worker exited 0
  kFailed,       // a local worker failed: root_cause
  kInterrupted,  // ddprun got a stop signal: interrupt_signal
  kStopped,      // the controller stopped the group: stop_reason
};

struct GroupResult {
  GroupOutcome outcome = GroupOutcome::kSucceeded;
  std::vector<WorkerResult> workers;  // by local rank
  int root_cause = -1;       // index into workers when kFailed
  int interrupt_signal = 0;  // set whenever ddprun got a stop signal
  std::string stop_reason;   // kStopped
};

// Where one attempt runs and writes.
struct GroupSpec {
  const LaunchOptions* options = nullptr;
  AttemptInfo attempt;
  std::string program_path;  // resolved (spawn.h resolve_program)
  // attempt_dir/<local_rank>/ holds error.json, and stdout.log/stderr.log
  // for the streams that are logged (--log-dir, -r, -t).
  std::string attempt_dir;
  bool log_all_streams = false;  // --log-dir: log every stream
};

// Multi-node hook (control.h): lets the launchers of other nodes stop this
// group and learn of its failure. Called from the event loop only.
class GroupController {
 public:
  virtual ~GroupController() = default;
  // Appends the fds the controller wants polled for reading.
  virtual void add_poll_fds(std::vector<pollfd>& fds) = 0;
  // After every wake-up: handles its fds and timers. Returns why the local
  // workers must stop (another node failed, a node stopped answering).
  virtual std::optional<std::string> service() = 0;
  // The first local failure, as soon as it is seen.
  virtual void on_local_failure(const WorkerResult& root) = 0;
  // Longest the loop may sleep before service() must run again, in ms.
  virtual int max_sleep_ms() const = 0;
  // The launcher got stop signal `signal` (the first one), before the
  // workers are signalled: the others may learn that this node leaves.
  virtual void on_interrupt(int signal) { (void)signal; }
};

// Runs one attempt (see the top of this file). Throws ddp::InvalidArgument
// or ddp::Error when a worker cannot be started (log file, exec, fork); the
// workers already started are killed first.
GroupResult run_worker_group(const GroupSpec& spec, SignalWatch& signals,
                             GroupController* controller = nullptr);

// Whether any local rank's output reaches the console, counted over ranks:
// more than one means lines get a "[rankN]:" prefix.
int ranks_on_console(const LaunchOptions& options);

}  // namespace ddp::launcher
