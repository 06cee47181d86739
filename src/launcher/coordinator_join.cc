// Node 0's side of the launchers' rendezvous, the joining part (control.h):
// nodes connect, introduce themselves and are admitted or refused; in an
// elastic job also during a round and between rounds (Note [Elastic rounds]).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "ddp/error.h"
#include "launcher/control.h"
#include "launcher/net.h"
#include "launcher/relay.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

bool has_rank(const std::vector<NodeLink>& links, int n) {
  return std::any_of(links.begin(), links.end(),
                     [&](const NodeLink& l) { return l.node_rank == n; });
}

}  // namespace

Coordinator::Coordinator(LaunchOptions& options, SignalWatch& signals)
    : o_(options), signals_(signals) {}

Coordinator::~Coordinator() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string Coordinator::join_timeout_message() const {
  const std::string same =
      !o_.rdzv_c10d ? std::string("--master-addr/--master-port")
      : o_.run_id == "none"
          ? fmt::format("--rdzv-endpoint {}:{} (and no --rdzv-id, or the same one)",
                        o_.master_addr, o_.master_port)
          : fmt::format("--rdzv-endpoint {}:{} and --rdzv-id {}", o_.master_addr,
                        o_.master_port, o_.run_id);
  if (o_.min_nnodes != o_.max_nnodes) {
    return fmt::format(
        "only {} node(s) of --nnodes {} (at least {}) joined at port {} within "
        "join_timeout={} s. Start ddprun on more nodes with the same --nnodes, "
        "--nproc-per-node and {}",
        links_.size() + 1, o_.nnodes_spec(), o_.min_nnodes, o_.master_port, o_.join_timeout,
        same);
  }
  std::vector<int> missing;
  for (int n = 1; n < o_.max_nnodes; ++n) {
    if (!has_rank(links_, n)) missing.push_back(n);
  }
  // Ranked at the rendezvous, nodes have no rank to miss, only a count.
  const std::string which =
      o_.rendezvous_ranks ? fmt::format("{} more needed", o_.max_nnodes - 1 - links_.size())
                          : fmt::format("missing node ranks: {}", fmt::join(missing, ", "));
  return fmt::format(
      "only {} of {} nodes joined at port {} within join_timeout={} s "
      "({}). Start ddprun on every node with the same "
      "--nnodes, --nproc-per-node and {}",
      links_.size() + 1, o_.max_nnodes, o_.master_port, o_.join_timeout, which, same);
}

void Coordinator::join(int listener) {
  if (listen_fd_ < 0) {
    listen_fd_ = listener >= 0 ? listener : listen_on(o_.master_port);
  }
  links_.insert(links_.end(), std::make_move_iterator(arrivals_.begin()),
                std::make_move_iterator(arrivals_.end()));
  arrivals_.clear();
  if (static_cast<int>(links_.size()) + 1 < o_.max_nnodes) launcher_message(waiting_message());
  const auto deadline = after(o_.join_timeout);
  std::optional<Clock::time_point> last_call;
  while (true) {
    const int have = static_cast<int>(links_.size()) + 1;
    if (have >= o_.max_nnodes) break;
    if (have >= o_.min_nnodes) {
      if (!last_call) last_call = after(o_.last_call_timeout);
      if (Clock::now() > *last_call) break;
    } else {
      last_call.reset();  // a node left: below MIN again
      if (Clock::now() > deadline) {
        finish_job(1, "not every node joined");
        throw TimeoutError(join_timeout_message());
      }
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {signals_.fd(), POLLIN, 0}};
    for (NodeLink& l : pending_) fds.push_back({l.fd(), POLLIN, 0});
    for (NodeLink& l : links_) fds.push_back({l.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), std::min(max_sleep_ms(), 200));
    for (int sig : signals_.read_pending()) {
      if (!is_stop_signal(sig)) continue;
      finish_job(1, fmt::format("node 0 got {} while nodes were joining", signal_name(sig)));
      throw Interrupted{sig};
    }
    if (fds[0].revents & POLLIN) accept_one();
    admit_pending();
    for (NodeLink& l : links_) {
      l.receive();
      l.tick();
      if (!l.alive()) {
        launcher_message(fmt::format("node {} ({}) left before the start: {}", l.node_rank,
                                     l.host, l.why_dead()));
      }
    }
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const NodeLink& l) { return !l.alive(); }),
                 links_.end());
  }
  if (!o_.elastic()) {
    ::close(listen_fd_);  // rank 0's TCPStore binds this port next
    listen_fd_ = -1;
  }
}

// What node 0 waits for before the next start.
std::string Coordinator::waiting_message() const {
  const int here = static_cast<int>(links_.size()) + 1;
  if (o_.min_nnodes == o_.max_nnodes) {
    return fmt::format("node 0: waiting for {} more node(s) on port {} (--nnodes {}, {} here)",
                       o_.max_nnodes - here, o_.master_port, o_.max_nnodes, here);
  }
  if (here >= o_.min_nnodes) {
    return fmt::format("node 0: waiting on port {} up to last_call_timeout={} s for more nodes "
                       "(--nnodes {}: {} here, enough to start)",
                       o_.master_port, o_.last_call_timeout, o_.nnodes_spec(), here);
  }
  return fmt::format("node 0: waiting on port {} for nodes (--nnodes {}: {} here, {} more to "
                     "start, then up to last_call_timeout={} s for more)",
                     o_.master_port, o_.nnodes_spec(), here, o_.min_nnodes - here,
                     o_.last_call_timeout);
}

bool Coordinator::accept_one() {
  int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return false;
  pending_.emplace_back(fd, o_.keep_alive_interval, o_.keep_alive_max_attempt);
  return true;
}

// Introduced connections are welcomed or refused; silent ones stay pending
// until they hang up or miss their heartbeats.
void Coordinator::admit_pending() {
  for (NodeLink& l : pending_) {
    for (const auto& m : l.receive()) {
      if (m.value("type", "") == "hello" && l.alive()) welcome(l, m);
    }
    if (l.alive()) l.tick();
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const NodeLink& l) { return !l.alive(); }),
                 pending_.end());
}

void Coordinator::welcome(NodeLink& link, const nlohmann::json& hello) {
  const bool running = in_round_;  // elastic: wait for the next round
  const int members = static_cast<int>(links_.size() + arrivals_.size()) + 1;
  int node = hello.value("node_rank", kNodeRankAtRendezvous);
  const bool assigned = node == kNodeRankAtRendezvous;
  if (assigned) {  // the c10d rendezvous: the lowest free rank
    node = 1;
    while (node < o_.max_nnodes && (has_rank(links_, node) || has_rank(arrivals_, node))) ++node;
  }
  const int max = hello.value("nnodes", -1);
  const std::string spec = max == hello.value("min_nnodes", max)
                               ? std::to_string(max)
                               : fmt::format("{}:{}", hello.value("min_nnodes", max), max);
  std::string problem;
  if (spec != o_.nnodes_spec()) {
    problem = fmt::format("--nnodes {} differs from node 0's {}", spec, o_.nnodes_spec());
  } else if (hello.value("nproc_per_node", -1) != o_.nproc_per_node) {
    problem = fmt::format("--nproc-per-node {} differs from node 0's {}",
                          hello.value("nproc_per_node", -1), o_.nproc_per_node);
  } else if (hello.value("run_id", "") != o_.run_id) {
    problem = fmt::format("--rdzv-id (--run-id) '{}' differs from node 0's '{}'",
                          hello.value("run_id", ""), o_.run_id);
  } else if (assigned && (node >= o_.max_nnodes || members >= o_.max_nnodes)) {
    problem = fmt::format("all {} nodes of --nnodes {} have joined already", o_.max_nnodes,
                          o_.nnodes_spec());
  } else if (node < 1 || node >= o_.max_nnodes) {
    problem = fmt::format("--node-rank {} is not in 1..{}", node, o_.max_nnodes - 1);
  } else if (has_rank(links_, node)) {
    problem = fmt::format("--node-rank {} has already joined: give each node its own rank", node);
  }
  if (!problem.empty()) {
    const std::string going_on =
        running ? fmt::format("the job goes on with its {} node(s)", members)
        : members < o_.min_nnodes
            ? fmt::format("still waiting for {} more node(s) (join_timeout={} s)",
                          o_.min_nnodes - members, o_.join_timeout)
            : "the next round starts with the nodes that are in";
    launcher_message(
        fmt::format("rejected a node from {}: {}; {}", hello.value("host", "?"), problem,
                    going_on));
    link.send({{"type", "reject"}, {"message", problem}});
    link.kill("rejected");
    return;
  }
  link.node_rank = node;
  link.host = hello.value("host", "?");
  link.send({{"type", "welcome"}, {"node_rank", node}});
  launcher_message(fmt::format("node {} ({}) joined{}", node, link.host,
                               assigned ? " (node rank assigned at the rendezvous)" : ""));
  if (!running) {
    links_.push_back(std::move(link));
    return;
  }
  arrivals_.push_back(std::move(link));
  joined_ = true;
  trigger_stop(fmt::format("node {} ({}) joined the elastic job: the workers restart with {} "
                           "nodes", node, arrivals_.back().host, members + 1));
}

// Elastic, during a round: new connections, and heartbeats of the nodes
// that wait for the next round.
void Coordinator::service_arrivals() {
  if (listen_fd_ < 0) return;
  while (accept_one()) {
  }
  admit_pending();
  for (NodeLink& l : arrivals_) {
    l.receive();
    l.tick();
    if (!l.alive()) {
      launcher_message(fmt::format("node {} ({}) left before its first round: {}", l.node_rank,
                                   l.host, l.why_dead()));
    }
  }
  arrivals_.erase(std::remove_if(arrivals_.begin(), arrivals_.end(),
                                 [](const NodeLink& l) { return !l.alive(); }),
                  arrivals_.end());
}

// Elastic, between rounds: the nodes lost in the round leave the job.
void Coordinator::drop_lost_nodes() {
  for (const NodeLink& l : links_) {
    if (!l.alive()) {
      launcher_message(fmt::format("node {} ({}) leaves the elastic job: {}", l.node_rank, l.host,
                                   l.why_dead()));
    }
  }
  links_.erase(std::remove_if(links_.begin(), links_.end(),
                              [](const NodeLink& l) { return !l.alive(); }),
               links_.end());
}

}  // namespace ddp::launcher
