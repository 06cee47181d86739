// Saying what went wrong from the flight records of a process group's
// ranks: ddp-trace's verdict, also printed by ddprun after a failed or
// interrupted attempt (Note [Flight verdict] in flight_verdict.cc). No
// libtorch.
#pragma once

#include <string>
#include <vector>

#include "flight/flight_trace.h"

namespace ddp::flight {

// How a launcher saw one of its workers end (the rings cannot say).
struct WorkerEnding {
  int pid = 0;
  bool failed = false;   // ended on its own: a non-zero exit or a signal
  bool stopped = false;  // ended after the launcher signalled it
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal ended it
};

// What a launcher knows of the attempt: the stop signal it passed on to
// every worker (a Ctrl-C; 0: none) and how each worker ended, by pid. With
// them the verdict blames no rank for an interruption, and names a rank
// that ended on its own outside the collectives instead of hedging.
// Default: nothing known (ddp-trace on its own).
struct AttemptFacts {
  int interrupt_signal = 0;
  std::vector<WorkerEnding> endings;
};

// The verdict over every rank's ring: a few lines per process group, first
// the conclusion ("rank 1 is behind: ...", "collective #7 differs across
// ranks: ...", "every rank reached ...", "interrupted by SIGINT ..."), then
// one line per rank with its last collective, its state, any event and, from
// `facts`, how it ended. "" when `traces` is empty.
std::string verdict(const std::vector<RankTrace>& traces, const AttemptFacts& facts = {});

// Whether the rings show a collective in the failure (Note [Kept flight
// records] in flight_recorder.cc): an entry that did not complete (timed
// out, failed, still running), or ranks of one group whose last collectives
// differ (one waits for another). False for a job that failed before its
// first collective or after its last: its rings need not be kept.
bool collective_involved(const std::vector<RankTrace>& traces);

// One entry as a line: "#12 all_reduce of gradient bucket 0 of 2
// (iteration 4) [all_reduce SUM float32[1024]] step 4 bucket 0: timed out
// after 30.00 s".
std::string describe_entry(const TraceEntry& e);

}  // namespace ddp::flight
