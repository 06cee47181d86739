// Multi-node: the launchers of a job (one per node) start and stop every
// attempt together, so that no rank is left behind on another node and
// --max-restarts restarts the whole job.
//
// Node 0's launcher (Coordinator) listens on --master-port until every
// other node's launcher (Agent) has joined, then closes the listener so
// global rank 0's TCPStore can bind the same port (the accepted connections
// stay up). For each attempt the coordinator sends "start"; a node whose
// worker fails sends "fail" at once, and the coordinator sends "stop" to
// all; each node reports "exit" when its workers are gone; the coordinator
// then restarts (if restarts are left and no node was lost or interrupted)
// or sends "done". Heartbeats (keep_alive_interval, keep_alive_max_attempt)
// detect a lost node; its peers stop their workers and exit non-zero.
//
// Thread safety: the launcher's main thread only.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/node_link.h"
#include "launcher/options.h"
#include "launcher/signals.h"
#include "launcher/summary.h"
#include "launcher/worker_group.h"

namespace ddp::launcher {

// Thrown when a stop signal reaches ddprun outside a worker group.
struct Interrupted {
  int signal;
};

// The steady-clock time `seconds` from now: the rendezvous' limits
// (join_timeout, grace_period) are seconds as doubles, and the steady clock
// does not jump when the wall clock is set.
inline std::chrono::steady_clock::time_point after(double seconds) {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

// What the job learned from one attempt, on the coordinator.
struct AttemptOutcome {
  bool succeeded = false;    // every node's workers exited 0
  bool restartable = false;  // worker failures only (no lost or stopped node)
  int interrupt_signal = 0;  // the coordinator itself was signalled
  std::optional<FailureReport> root;  // the first failure seen, any node
  std::string reason;                 // why the attempt was stopped
  std::vector<std::string> notes;     // per-node lines for the summary
};

class Coordinator : public GroupController {
 public:
  Coordinator(const LaunchOptions& options, SignalWatch& signals);
  ~Coordinator() override;

  // Waits for the other nnodes - 1 launchers on `listener` (a socket from
  // try_listen_on, owned from now on) or, when -1, on a socket of its own.
  // A node that comes without a node rank (kNodeRankAtRendezvous) gets the
  // lowest free one, so ranks follow the order of arrival. Throws
  // InvalidArgument naming --master-port if it is taken, TimeoutError naming
  // the missing node ranks after join_timeout, Interrupted on a stop signal.
  void join(int listener = -1);
  // Tells every node to start attempt `restart_count`.
  void start_attempt(int restart_count);
  // After the local group ended: waits for every node's exit report of this
  // attempt (while they answer heartbeats; at most grace_period + 5 s once
  // the attempt is being stopped) and says what the job should do.
  AttemptOutcome finish_attempt(const GroupResult& local);
  // Tells every node the job is over, with the exit code they should use.
  void finish_job(int exit_code, const std::string& reason);

  void add_poll_fds(std::vector<pollfd>& fds) override;
  std::optional<std::string> service() override;
  void on_local_failure(const WorkerResult& root) override;
  int max_sleep_ms() const override;

 private:
  void handle(NodeLink& link, const nlohmann::json& m);
  void note_failure(const FailureReport& report);
  void trigger_stop(const std::string& reason);
  void broadcast(const nlohmann::json& m);
  bool accept_one(std::vector<NodeLink>& pending);
  void welcome(NodeLink& link, const nlohmann::json& hello);

  const LaunchOptions& o_;
  SignalWatch& signals_;
  int listen_fd_ = -1;
  std::vector<NodeLink> links_;  // one per other node, by arrival
  int attempt_ = -1;
  std::optional<std::string> stop_reason_;  // set once "stop" went out
  std::optional<FailureReport> root_;       // first failure, any node
  std::map<int, std::string> node_states_;  // node rank -> how it ended
  bool lost_ = false;                       // a node vanished
};

// What an agent is told to do next.
struct Order {
  enum Kind { kStart, kDone, kLost } kind = kLost;
  int restart_count = 0;  // kStart
  int exit_code = 1;      // kDone
  std::string reason;     // kDone with a failure, kLost
};

class Agent : public GroupController {
 public:
  Agent(const LaunchOptions& options, SignalWatch& signals);

  // Connects to node 0 (retrying until join_timeout) and joins; returns
  // this node's rank (the one node 0 assigned when options.node_rank is
  // kNodeRankAtRendezvous). Throws TimeoutError naming the address after
  // join_timeout, InvalidArgument when node 0 rejects this node (its
  // message says why), Interrupted.
  int join();
  // Waits for node 0's next order, for as long as node 0 answers
  // heartbeats (kLost once it does not). Throws Interrupted.
  Order next_order();
  // Reports how the local group of attempt `restart_count` ended.
  void report_exit(int restart_count, const GroupResult& local);

  void add_poll_fds(std::vector<pollfd>& fds) override;
  std::optional<std::string> service() override;
  void on_local_failure(const WorkerResult& root) override;
  int max_sleep_ms() const override;

 private:
  bool introduce();
  std::string self() const;  // "node 2", or "this node" before assignment

  const LaunchOptions& o_;
  int node_rank_;  // o_.node_rank, or the one node 0 assigned
  SignalWatch& signals_;
  std::optional<NodeLink> link_;
  int attempt_ = -1;
  std::optional<std::string> stop_reason_;  // why this attempt must stop
  std::vector<nlohmann::json> orders_;      // start/done that came early
};

}  // namespace ddp::launcher
