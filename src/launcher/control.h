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
// detect a lost node; its peers stop their workers and exit non-zero. A
// node whose launcher gets a stop signal sends "leaving" before it stops its
// workers, so node 0 blames that node, not the ranks its loss made fail.
//
// Note [Elastic rounds]: with --nnodes MIN:MAX (torchrun's elastic
// membership), and with a fixed --nnodes N whose node ranks the c10d
// rendezvous assigns (torchrun's N:N: a lost node is replaced, not fatal),
// the job runs in rounds. Node 0 (the host of the c10d
// rendezvous) waits until MIN nodes are in, then up to last_call_timeout
// for more (never more than MAX), and starts a round: every "start" carries
// the round's number, the node's rank in it (node 0, then the others in
// order of arrival, without gaps), the round's node count and a fresh port
// for global rank 0's TCPStore (the listener stays open on the rendezvous
// port, for late nodes). A node that arrives during a round, or a node that
// is lost (its connection closes, it misses its heartbeats, it does not
// report within the grace period, or its launcher got a stop signal and
// said it leaves), ends the round: every node stops its workers and node 0
// forms the next round from the nodes it still has,
// waiting again (up to join_timeout) if they are fewer than MIN. As in
// torchrun, such a membership change does not use up --max-restarts and
// leaves TORCHELASTIC_RESTART_COUNT as it was; a worker failure (with no
// membership change in its round) does both. Node 0 itself cannot be lost:
// its loss ends the job on every node, as the loss of torchrun's store host
// does. Messages about a round carry its number as "attempt".
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
  // Elastic: a node joined or was lost during the round; the next round
  // starts without using up a restart (Note [Elastic rounds]).
  bool membership_changed = false;
  int interrupt_signal = 0;  // the coordinator itself was signalled
  std::optional<FailureReport> root;  // the first failure seen, any node
  std::string reason;                 // why the attempt was stopped
  std::vector<std::string> notes;     // per-node lines for the summary
};

class Coordinator : public GroupController {
 public:
  // `options` is the launcher's own copy: in an elastic job start_attempt
  // sets its nnodes for each round.
  Coordinator(LaunchOptions& options, SignalWatch& signals);
  ~Coordinator() override;

  // Waits for the other nnodes - 1 launchers on `listener` (a socket from
  // try_listen_on, owned from now on) or, when -1, on a socket of its own;
  // elastic: for min_nnodes - 1 at least, then up to last_call_timeout for
  // more (and called again between rounds). A node that comes without a
  // node rank (kNodeRankAtRendezvous) gets the lowest free one, so ranks
  // follow the order of arrival. Throws InvalidArgument naming
  // --master-port if it is taken, TimeoutError naming the missing node ranks
  // after join_timeout, Interrupted on a stop signal.
  void join(int listener = -1);
  // Tells every node to start round `round` with TORCHELASTIC_RESTART_COUNT
  // `restart_count` (the same number unless elastic). Returns the port of
  // global rank 0's TCPStore for this round: master_port, or when elastic a
  // free port (and options.nnodes is set to the round's node count).
  int start_attempt(int restart_count, int round);
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
  bool accept_one();
  void admit_pending();
  void welcome(NodeLink& link, const nlohmann::json& hello);
  void service_arrivals();
  void drop_lost_nodes();
  std::string join_timeout_message() const;
  std::string waiting_message() const;

  LaunchOptions& o_;
  SignalWatch& signals_;
  int listen_fd_ = -1;
  std::vector<NodeLink> pending_;   // connected, not yet introduced
  std::vector<NodeLink> links_;     // one per other node of the round
  std::vector<NodeLink> arrivals_;  // elastic: joined during a round
  int attempt_ = -1;                // the round
  std::optional<std::string> stop_reason_;  // set once "stop" went out
  std::optional<FailureReport> root_;       // first failure, any node
  std::map<int, std::string> node_states_;  // node rank -> how it ended
  bool lost_ = false;                       // a node vanished
  bool joined_ = false;                     // elastic: a node arrived
  bool in_round_ = false;  // from start_attempt to the end of finish_attempt
};

// What an agent is told to do next.
struct Order {
  enum Kind { kStart, kDone, kLost } kind = kLost;
  int restart_count = 0;  // kStart: TORCHELASTIC_RESTART_COUNT
  int exit_code = 1;      // kDone
  std::string reason;     // kDone with a failure, kLost
  int round = 0;          // kStart: the attempt directory's number
  int node_rank = 0;      // kStart: this node's rank in the round
  int nnodes = 1;         // kStart: nodes in the round
  int master_port = 0;    // kStart: global rank 0's TCPStore
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
  // Reports how the local group of round `round` ended.
  void report_exit(int round, const GroupResult& local);

  void add_poll_fds(std::vector<pollfd>& fds) override;
  std::optional<std::string> service() override;
  void on_local_failure(const WorkerResult& root) override;
  int max_sleep_ms() const override;
  // Tells node 0 this node leaves (Note [Elastic rounds]).
  void on_interrupt(int signal) override;

 private:
  bool introduce(std::chrono::steady_clock::time_point join_deadline);
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
