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

void Coordinator::broadcast(const nlohmann::json& m) {
  for (NodeLink& l : links_) l.send(m);
}

int Coordinator::start_attempt(int restart_count, int round) {
  attempt_ = round;
  in_round_ = true;
  stop_reason_.reset();
  root_.reset();
  node_states_.clear();
  lost_ = false;
  joined_ = false;
  int store_port = o_.master_port;
  if (o_.elastic()) {  // Note [Elastic rounds]: ranks without gaps, a fresh store port
    o_.nnodes = static_cast<int>(links_.size()) + 1;
    store_port = pick_free_port();
    for (size_t i = 0; i < links_.size(); ++i) links_[i].node_rank = static_cast<int>(i) + 1;
    launcher_message(fmt::format("round {}: {} node(s), world size {}", round, o_.nnodes,
                                 o_.world_size()));
  }
  for (NodeLink& l : links_) {
    l.send({{"type", "start"},
            {"restart", restart_count},
            {"round", round},
            {"node_rank", l.node_rank},
            {"nnodes", o_.nnodes},
            {"master_port", store_port}});
  }
  return store_port;
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
  if (type == "leaving") {  // its launcher got a stop signal
    const std::string why = "its launcher got " + m.value("signal", std::string("a signal"));
    if (o_.elastic() && node_states_.emplace(link.node_rank, "left the job: " + why).second) {
      lost_ = true;  // Note [Elastic rounds]: it leaves, the others go on
      trigger_stop(fmt::format("node {} ({}) leaves the job: {}", link.node_rank, link.host, why));
      link.kill(why);
    } else {
      trigger_stop(fmt::format("node {} ({}): {}", link.node_rank, link.host, why));
    }
    return;
  }
  if (type != "exit") return;
  const std::string outcome = m.value("outcome", "?");
  node_states_.emplace(link.node_rank, outcome);
  if (m.contains("report") && !root_) root_ = failure_from_json(m["report"]);
  if (outcome != "succeeded") {
    trigger_stop(fmt::format("node {} ({}) {}", link.node_rank, link.host, outcome));
  }
}

void Coordinator::add_poll_fds(std::vector<pollfd>& fds) {
  if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});  // elastic
  for (auto* links : {&pending_, &links_, &arrivals_}) {
    for (NodeLink& l : *links) {
      if (l.alive()) fds.push_back({l.fd(), POLLIN, 0});
    }
  }
}

int Coordinator::max_sleep_ms() const {
  int ms = 1000;
  for (auto* links : {&pending_, &links_, &arrivals_}) {
    for (const NodeLink& l : *links) ms = std::min(ms, l.ms_until_tick());
  }
  return ms;
}

std::optional<std::string> Coordinator::service() {
  if (o_.elastic()) service_arrivals();
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
  while (node_states_.size() < links_.size()) {
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
  for (NodeLink& l : links_) {
    const std::string late =
        fmt::format("did not report within {} s of the stop", o_.grace_period + 5);
    if (node_states_.emplace(l.node_rank, late).second) {
      lost_ = true;
      if (o_.elastic()) l.kill(late);  // it leaves the job (drop_lost_nodes)
    }
  }
  in_round_ = false;
  bool all_ok = local.outcome == GroupOutcome::kSucceeded;
  bool interrupted = out.interrupt_signal != 0;
  for (const auto& [node, state] : node_states_) {
    all_ok = all_ok && state == "succeeded";
    interrupted = interrupted || state == "interrupted";
    out.notes.push_back(fmt::format("node {}: {}", node, state));
  }
  out.notes.insert(out.notes.begin(), fmt::format("node 0: {}", outcome_name(local.outcome)));
  out.succeeded = all_ok && !lost_;  // a node that joined at the very end is told "done"
  out.membership_changed = o_.elastic() && (lost_ || joined_) && !interrupted;
  out.restartable = !out.succeeded && !lost_ && !interrupted;
  if (out.membership_changed) drop_lost_nodes();
  out.root = root_;
  out.reason = stop_reason_.value_or("");
  return out;
}

void Coordinator::finish_job(int exit_code, const std::string& reason) {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  for (NodeLink& l : arrivals_) links_.push_back(std::move(l));
  arrivals_.clear();
  pending_.clear();
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
