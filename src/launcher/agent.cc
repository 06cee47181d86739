// The side of the launchers' rendezvous run on nodes 1..nnodes-1
// (control.h).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

#include "ddp/error.h"
#include "launcher/control.h"
#include "launcher/net.h"
#include "launcher/relay.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps up to `ms` while watching for stop signals.
void wait_or_interrupt(SignalWatch& signals, int extra_fd, int ms) {
  pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::poll(fds, extra_fd >= 0 ? 2 : 1, ms);
  for (int sig : signals.read_pending()) {
    if (is_stop_signal(sig)) throw Interrupted{sig};
  }
}

}  // namespace

Agent::Agent(const LaunchOptions& options, SignalWatch& signals)
    : o_(options), signals_(signals), node_rank_(options.node_rank) {}

std::string Agent::self() const {
  return node_rank_ == kNodeRankAtRendezvous ? std::string("this node")
                                             : fmt::format("node {}", node_rank_);
}

// Sends hello on a fresh connection; true once node 0 welcomed us (by
// `join_deadline` at the latest).
bool Agent::introduce(std::chrono::steady_clock::time_point join_deadline) {
  link_->send({{"type", "hello"},
               {"node_rank", o_.node_rank},
               {"nnodes", o_.max_nnodes},
               {"min_nnodes", o_.min_nnodes},
               {"nproc_per_node", o_.nproc_per_node},
               {"run_id", o_.run_id},
               {"host", o_.local_addr.empty() ? host_name()
                                              : host_name() + " " + o_.local_addr}});
  // Something else may be listening on the port: do not wait for ever.
  const auto deadline = std::min(after(10), join_deadline);
  while (link_->alive() && Clock::now() < deadline) {
    wait_or_interrupt(signals_, link_->fd(), 200);
    bool welcomed = false;
    for (auto& m : link_->receive()) {
      const std::string type = m.value("type", "");
      if (welcomed && (type == "start" || type == "done")) {
        orders_.push_back(std::move(m));  // came in the same read
        continue;
      }
      if (type == "welcome") {
        welcomed = true;
        node_rank_ = m.value("node_rank", node_rank_);
      }
      if (type == "reject") {
        throw InvalidArgument(fmt::format("node 0 at {}:{} rejected {}: {}", o_.master_addr,
                                          o_.master_port, self(), m.value("message", "")));
      }
      if (type == "done") {
        throw Error(fmt::format("node 0 ended the job before it started: {}",
                                m.value("reason", "")));
      }
    }
    if (welcomed) return true;
  }
  return false;
}

int Agent::join() {
  const auto deadline = after(o_.join_timeout);
  std::string last_error = "no answer";
  bool told = false;
  bool answered = false;  // something accepted the connection but sent no welcome
  int unwelcomed = 0;      // such connections in a row
  while (Clock::now() < deadline) {
    int fd = connect_to(o_.master_addr, o_.master_port, 2000, last_error);
    if (fd >= 0) {
      answered = true;
      link_.emplace(fd, o_.keep_alive_interval, o_.keep_alive_max_attempt);
      link_->node_rank = 0;
      if (introduce(deadline)) return node_rank_;
      last_error = link_->alive() ? "no welcome from node 0" : link_->why_dead();
      link_.reset();
      // A launcher waiting for nodes answers a hello at once (welcome or
      // reject): twice no answer is a job that started without us (its
      // store holds the port) or another program, neither of which changes
      // by waiting out join_timeout.
      if (++unwelcomed == 2) break;
    } else {
      unwelcomed = 0;
    }
    if (!told) {
      launcher_message(fmt::format("{}: waiting for node 0 at {}:{} ({})", self(),
                                   o_.master_addr, o_.master_port, last_error));
      told = true;
    }
    wait_or_interrupt(signals_, -1, 500);
  }
  const std::string way_out =
      answered
          ? "Something accepts connections there but no launcher waits for nodes: the job "
            "may have started already (all of its --nnodes joined; ddprun admits no node "
            "to a running job) or the port belongs to another program. Check --nnodes and "
            "the endpoint"
      : node_rank_ == kNodeRankAtRendezvous
          ? "Start ddprun on that host too (the launcher there hosts the c10d rendezvous), "
            "or pass --rdzv-conf is_host=true on the node that should host it, and check "
            "--rdzv-endpoint and the network"
          : "Start ddprun with --node-rank 0 there, and check --master-addr/--master-port "
            "and the network";
  if (unwelcomed == 2) {
    throw Error(fmt::format(
        "{} could not join node 0 at {}:{}: twice something accepted the connection but no "
        "launcher answered (last error: {}). {}",
        self(), o_.master_addr, o_.master_port, last_error, way_out));
  }
  throw TimeoutError(fmt::format(
      "{} could not join node 0 at {}:{} within join_timeout={} s (last error: {}). {}",
      self(), o_.master_addr, o_.master_port, o_.join_timeout, last_error, way_out));
}

Order Agent::next_order() {
  // No deadline of its own: node 0 may be waiting for other nodes' workers
  // for as long as they run; the heartbeats bound the wait.
  while (true) {
    while (!orders_.empty()) {
      nlohmann::json m = orders_.front();
      orders_.erase(orders_.begin());
      Order order;
      if (m.value("type", "") == "start") {
        order.kind = Order::kStart;
        order.restart_count = m.value("restart", 0);
        order.round = attempt_ = m.value("round", order.restart_count);
        order.node_rank = node_rank_ = m.value("node_rank", node_rank_);
        order.nnodes = m.value("nnodes", o_.nnodes);
        order.master_port = m.value("master_port", o_.master_port);
        stop_reason_.reset();  // a late "stop" of the previous attempt
        return order;
      }
      order.kind = Order::kDone;
      order.exit_code = m.value("code", 1);
      order.reason = m.value("reason", "");
      return order;
    }
    if (!link_->alive()) {
      return {Order::kLost, 0, 1,
              fmt::format("lost contact with node 0 ({}:{}): {}", o_.master_addr,
                          o_.master_port, link_->why_dead())};
    }
    wait_or_interrupt(signals_, link_->fd(), link_->ms_until_tick());
    service();
  }
}

void Agent::add_poll_fds(std::vector<pollfd>& fds) {
  if (link_ && link_->alive()) fds.push_back({link_->fd(), POLLIN, 0});
}

int Agent::max_sleep_ms() const { return link_ ? link_->ms_until_tick() : 1000; }

std::optional<std::string> Agent::service() {
  if (!link_) return std::nullopt;
  for (auto& m : link_->receive()) {
    const std::string type = m.value("type", "");
    if (type == "stop" && m.value("attempt", -1) == attempt_ && !stop_reason_) {
      stop_reason_ = "node 0 stopped the job: " + m.value("reason", "");
    }
    if (type == "done" && !stop_reason_) {
      stop_reason_ = "node 0 ended the job: " + m.value("reason", "");
    }
    if (type == "start" || type == "done") orders_.push_back(std::move(m));
  }
  link_->tick();
  if (!link_->alive() && !stop_reason_) {
    stop_reason_ = fmt::format("lost contact with node 0 ({}:{}): {}", o_.master_addr,
                               o_.master_port, link_->why_dead());
  }
  return stop_reason_;
}

void Agent::on_local_failure(const WorkerResult& root) {
  link_->send({{"type", "fail"},
               {"attempt", attempt_},
               {"report", to_json(make_failure_report(root, node_rank_))}});
}

void Agent::on_interrupt(int signal) {
  if (link_) {
    link_->send({{"type", "leaving"}, {"attempt", attempt_}, {"signal", signal_name(signal)}});
  }
}

void Agent::report_exit(int round, const GroupResult& local) {
  static const char* names[] = {"succeeded", "failed", "interrupted", "stopped"};
  nlohmann::json m = {{"type", "exit"},
                      {"attempt", round},
                      {"outcome", names[static_cast<int>(local.outcome)]}};
  if (local.root_cause >= 0) {
    m["report"] = to_json(make_failure_report(local.workers[local.root_cause], node_rank_));
  }
  link_->send(m);
  stop_reason_.reset();
}

}  // namespace ddp::launcher
