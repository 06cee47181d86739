// Node 0's side of the launchers' rendezvous (control.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "ddp/error.h"
#include "launcher/control.h"
#include "launcher/net.h"
#include "launcher/relay.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

const char* outcome_name(GroupOutcome o) {
  switch (o) {
    case GroupOutcome::kSucceeded: return "succeeded";
    case GroupOutcome::kFailed: return "failed";
    case GroupOutcome::kInterrupted: return "interrupted";
    case GroupOutcome::kStopped: return "stopped";
  }
  return "unknown";
}

}  // namespace

Coordinator::Coordinator(const LaunchOptions& options, SignalWatch& signals)
    : o_(options), signals_(signals) {}

Coordinator::~Coordinator() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void Coordinator::join(int listener) {
  listen_fd_ = listener >= 0 ? listener : listen_on(o_.master_port);
  launcher_message(fmt::format("node 0: waiting for {} more node(s) on port {}",
                               o_.nnodes - 1, o_.master_port));
  const auto deadline = after(o_.join_timeout);
  std::vector<NodeLink> pending;  // connected, not yet introduced
  while (static_cast<int>(links_.size()) < o_.nnodes - 1) {
    if (Clock::now() > deadline) {
      std::vector<int> missing;
      for (int n = 1; n < o_.nnodes; ++n) {
        bool in = std::any_of(links_.begin(), links_.end(),
                              [&](const NodeLink& l) { return l.node_rank == n; });
        if (!in) missing.push_back(n);
      }
      finish_job(1, "not every node joined");
      throw TimeoutError(fmt::format(
          "only {} of {} nodes joined at port {} within join_timeout={} s "
          "(missing node ranks: {}). Start ddprun on every node with the same "
          "--nnodes, --nproc-per-node and --master-addr/--master-port",
          links_.size() + 1, o_.nnodes, o_.master_port, o_.join_timeout,
          fmt::join(missing, ", ")));
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {signals_.fd(), POLLIN, 0}};
    for (NodeLink& l : pending) fds.push_back({l.fd(), POLLIN, 0});
    add_poll_fds(fds);
    ::poll(fds.data(), fds.size(), max_sleep_ms());
    for (int sig : signals_.read_pending()) {
      if (!is_stop_signal(sig)) continue;
      finish_job(1, fmt::format("node 0 got {} while nodes were joining", signal_name(sig)));
      throw Interrupted{sig};
    }
    if (fds[0].revents & POLLIN) accept_one(pending);
    for (NodeLink& l : pending) {
      for (const auto& m : l.receive()) {
        if (m.value("type", "") == "hello") welcome(l, m);
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const NodeLink& l) { return !l.alive(); }),
                  pending.end());
    for (NodeLink& l : links_) {
      l.receive();
      l.tick();
      if (!l.alive()) launcher_message(fmt::format("node {} left before the start: {}", l.node_rank, l.why_dead()));
    }
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const NodeLink& l) { return !l.alive(); }),
                 links_.end());
  }
  ::close(listen_fd_);  // rank 0's TCPStore binds this port next
  listen_fd_ = -1;
}

bool Coordinator::accept_one(std::vector<NodeLink>& pending) {
  int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return false;
  pending.emplace_back(fd, o_.keep_alive_interval, o_.keep_alive_max_attempt);
  return true;
}

void Coordinator::welcome(NodeLink& link, const nlohmann::json& hello) {
  auto taken = [&](int n) {
    return std::any_of(links_.begin(), links_.end(),
                       [&](const NodeLink& l) { return l.node_rank == n; });
  };
  int node = hello.value("node_rank", kNodeRankAtRendezvous);
  const bool assigned = node == kNodeRankAtRendezvous;
  if (assigned) {  // the c10d rendezvous: the lowest free rank
    node = 1;
    while (node < o_.nnodes && taken(node)) ++node;
  }
  std::string problem;
  if (hello.value("nnodes", -1) != o_.nnodes) {
    problem = fmt::format("--nnodes {} differs from node 0's {}", hello.value("nnodes", -1), o_.nnodes);
  } else if (hello.value("nproc_per_node", -1) != o_.nproc_per_node) {
    problem = fmt::format("--nproc-per-node {} differs from node 0's {}",
                          hello.value("nproc_per_node", -1), o_.nproc_per_node);
  } else if (hello.value("run_id", "") != o_.run_id) {
    problem = fmt::format("--rdzv-id (--run-id) '{}' differs from node 0's '{}'",
                          hello.value("run_id", ""), o_.run_id);
  } else if (assigned && node >= o_.nnodes) {
    problem = fmt::format("all {} nodes of --nnodes {} have joined already", o_.nnodes, o_.nnodes);
  } else if (node < 1 || node >= o_.nnodes) {
    problem = fmt::format("--node-rank {} is not in 1..{}", node, o_.nnodes - 1);
  } else if (taken(node)) {
    problem = fmt::format("--node-rank {} has already joined: give each node its own rank", node);
  }
  if (!problem.empty()) {
    launcher_message(fmt::format("rejected a node from {}: {}", hello.value("host", "?"), problem));
    link.send({{"type", "reject"}, {"message", problem}});
    link.kill("rejected");
    return;
  }
  link.node_rank = node;
  link.host = hello.value("host", "?");
  link.send({{"type", "welcome"}, {"node_rank", node}});
  launcher_message(fmt::format("node {} ({}) joined{}", node, link.host,
                               assigned ? " (node rank assigned at the rendezvous)" : ""));
  links_.push_back(std::move(link));
}

void Coordinator::broadcast(const nlohmann::json& m) {
  for (NodeLink& l : links_) l.send(m);
}

void Coordinator::start_attempt(int restart_count) {
  attempt_ = restart_count;
  stop_reason_.reset();
  root_.reset();
  node_states_.clear();
  lost_ = false;
  broadcast({{"type", "start"}, {"restart", restart_count}});
}

void Coordinator::trigger_stop(const std::string& reason) {
  if (stop_reason_) return;
  stop_reason_ = reason;
  broadcast({{"type", "stop"}, {"attempt", attempt_}, {"reason", reason}});
}

void Coordinator::note_failure(const FailureReport& report) {
  if (!root_) root_ = report;
  trigger_stop(root_cause_line(report));
}

void Coordinator::handle(NodeLink& link, const nlohmann::json& m) {
  if (m.value("attempt", -1) != attempt_) return;  // late news of an old attempt
  const std::string type = m.value("type", "");
  if (type == "fail" && m.contains("report")) note_failure(failure_from_json(m["report"]));
  if (type != "exit") return;
  const std::string outcome = m.value("outcome", "?");
  node_states_.emplace(link.node_rank, outcome);
  if (m.contains("report") && !root_) root_ = failure_from_json(m["report"]);
  if (outcome != "succeeded") {
    trigger_stop(fmt::format("node {} ({}) {}", link.node_rank, link.host, outcome));
  }
}

void Coordinator::add_poll_fds(std::vector<pollfd>& fds) {
  for (NodeLink& l : links_) {
    if (l.alive()) fds.push_back({l.fd(), POLLIN, 0});
  }
}

int Coordinator::max_sleep_ms() const {
  int ms = 1000;
  for (const NodeLink& l : links_) ms = std::min(ms, l.ms_until_tick());
  return ms;
}

std::optional<std::string> Coordinator::service() {
  for (NodeLink& l : links_) {
    const bool was_alive = l.alive();
    for (const auto& m : l.receive()) handle(l, m);
    l.tick();
    if (was_alive && !l.alive() && attempt_ >= 0 &&
        node_states_.emplace(l.node_rank, "lost contact: " + l.why_dead()).second) {
      lost_ = true;
      trigger_stop(fmt::format("lost contact with node {} ({}): {}", l.node_rank,
                               l.host, l.why_dead()));
    }
  }
  return stop_reason_;
}

void Coordinator::on_local_failure(const WorkerResult& root) {
  note_failure(make_failure_report(root, 0));
}

AttemptOutcome Coordinator::finish_attempt(const GroupResult& local) {
  AttemptOutcome out;
  out.interrupt_signal = local.interrupt_signal;
  if (local.interrupt_signal != 0) {
    trigger_stop(fmt::format("node 0 got {}", signal_name(local.interrupt_signal)));
  }
  // Nodes still running after our workers succeeded may run for as long as
  // they like (heartbeats bound the wait); once a stop went out, a healthy
  // node reports within its grace period.
  std::optional<Clock::time_point> deadline;
  while (static_cast<int>(node_states_.size()) < o_.nnodes - 1) {
    if (stop_reason_ && !deadline) deadline = after(o_.grace_period + 5);
    if (deadline && Clock::now() > *deadline) break;
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    add_poll_fds(fds);
    ::poll(fds.data(), fds.size(), max_sleep_ms());
    for (int sig : signals_.read_pending()) {
      if (!is_stop_signal(sig)) continue;
      out.interrupt_signal = sig;
      trigger_stop(fmt::format("node 0 got {}", signal_name(sig)));
    }
    service();
  }
  for (const NodeLink& l : links_) {
    if (node_states_.emplace(l.node_rank, fmt::format("did not report within {} s of the stop",
                                                      o_.grace_period + 5)).second) {
      lost_ = true;
    }
  }
  bool all_ok = local.outcome == GroupOutcome::kSucceeded;
  bool interrupted = out.interrupt_signal != 0;
  for (const auto& [node, state] : node_states_) {
    all_ok = all_ok && state == "succeeded";
    interrupted = interrupted || state == "interrupted";
    out.notes.push_back(fmt::format("node {}: {}", node, state));
  }
  out.notes.insert(out.notes.begin(), fmt::format("node 0: {}", outcome_name(local.outcome)));
  out.succeeded = all_ok && !lost_;
  out.restartable = !out.succeeded && !lost_ && !interrupted;
  out.root = root_;
  out.reason = stop_reason_.value_or("");
  return out;
}

void Coordinator::finish_job(int exit_code, const std::string& reason) {
  broadcast({{"type", "done"}, {"code", exit_code}, {"reason", reason}});
  for (NodeLink& l : links_) {
    if (l.alive()) ::shutdown(l.fd(), SHUT_WR);
  }
  // Let the peers read "done" and hang up first, so our close cannot reset
  // the connection under an unread message.
  const auto deadline = after(1.0);
  while (Clock::now() < deadline) {
    std::vector<pollfd> fds;
    add_poll_fds(fds);
    if (fds.empty()) break;
    ::poll(fds.data(), fds.size(), 100);
    for (NodeLink& l : links_) l.receive();
  }
  links_.clear();
}

}  // namespace ddp::launcher
