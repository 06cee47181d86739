// The failure summary printed when a job fails: the root cause first (global
// and local rank, node and host, exit code or signal name, time, pid, the
// error file and its message, the last lines the worker wrote to stderr),
// then how every other rank ended. Modelled on torchrun's ChildFailedError
// report.
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include "launcher/worker_group.h"

namespace ddp::launcher {

// One failed worker, enough to report it on any node.
struct FailureReport {
  int node_rank = 0;
  std::string host;
  int rank = -1;
  int local_rank = -1;
  long pid = 0;
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal killed it
  double time = 0;      // seconds since the epoch
  std::vector<std::string> stderr_tail;
  std::string error_file;     // path, empty when the worker wrote none
  std::string error_message;  // from the error file (with its traceback)
  // It recorded its error and was then stopped by ddprun (before it could
  // exit on its own): Note [Root cause].
  bool stopped_after_error = false;
};

// This host's name.
std::string host_name();

// "exit code 3", "signal SIGKILL (9)".
std::string describe_end(int exit_code, int signal);

// The message of a torchelastic error file ({"message": {"message": ...,
// "extraInfo": {"py_callstack": ...}}} or {"message": "..."}), or a note
// saying why it could not be read.
std::string read_error_message(const std::string& path);

// Note [Root cause]
// The root cause of a failed group is the first failure in time, not the
// first exit ddprun happens to reap: a rank may record its error and take a
// while to exit (or be stopped by ddprun before it does), while a peer that
// lost it fails and exits at once. A ddp program's error file holds when the
// error was recorded (microseconds) and whether it follows another rank's
// failure (src/error_signs.h: a lost peer, "a peer rank closed its
// connection", "another rank failed first", a co-located rank that exited;
// or another rank's error reported by a collective call, as save_checkpoint
// reports rank 0's full disk on every rank at once, so that the times alone
// cannot tell). Among the failed workers, and the stopped
// ones that had recorded an error, the root cause is the earliest that did
// not lose a peer, else the earliest; a worker without an error file counts
// at the time ddprun saw it end.

// Reads the error file's time and lost-peer flag into `worker` (nothing
// when it has none, or one without them: torchrun-style programs).
void read_error_facts(WorkerResult& worker);

// The index of the root cause among `workers`, by Note [Root cause];
// `first_seen` (the first failure reaped) when no other comes first.
int pick_root_cause(const std::vector<WorkerResult>& workers, int first_seen);

// A report of a local worker (reads its error file).
FailureReport make_failure_report(const WorkerResult& worker, int node_rank);

// One line: "rank 1 (local_rank 1) on node 0 (host) failed: exit code 3".
std::string root_cause_line(const FailureReport& root);

// The whole block under the heading "ddprun: <title>". `others` are this
// node's workers (the root cause among them is skipped); `notes` are extra
// lines about other nodes.
std::string format_summary(const std::string& title, const FailureReport& root,
                           const std::vector<WorkerResult>& others,
                           const std::vector<std::string>& notes);

// How one non-root worker ended: "stopped by ddprun (signal SIGTERM (15))".
std::string describe_worker(const WorkerResult& worker);

}  // namespace ddp::launcher
