#include "launcher/node_link.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ddp::launcher {
namespace {

// A peer that sends a line longer than this is not a ddprun launcher.
constexpr std::size_t kMaxMessage = 1 << 20;

NodeLink::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<NodeLink::Clock::duration>(
      std::chrono::duration<double>(s));
}

}  // namespace

NodeLink::NodeLink(int fd, double keep_alive_interval, int max_attempts)
    : fd_(fd),
      interval_(seconds(keep_alive_interval)),
      silence_limit_(seconds(keep_alive_interval * max_attempts)),
      last_sent_(Clock::now()),
      last_received_(Clock::now()) {}

NodeLink::~NodeLink() {
  if (fd_ >= 0) ::close(fd_);
}

NodeLink::NodeLink(NodeLink&& o) noexcept { *this = std::move(o); }

NodeLink& NodeLink::operator=(NodeLink&& o) noexcept {
  if (this == &o) return *this;
  if (fd_ >= 0) ::close(fd_);
  fd_ = o.fd_;
  o.fd_ = -1;
  inbox_ = std::move(o.inbox_);
  why_dead_ = std::move(o.why_dead_);
  interval_ = o.interval_;
  silence_limit_ = o.silence_limit_;
  last_sent_ = o.last_sent_;
  last_received_ = o.last_received_;
  node_rank = o.node_rank;
  host = std::move(o.host);
  return *this;
}

void NodeLink::kill(const std::string& why) {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  why_dead_ = why;
}

void NodeLink::send(const nlohmann::json& message) {
  if (fd_ < 0) return;
  std::string line = message.dump() + "\n";
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::send(fd_, line.data() + off, line.size() - off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      // Messages are tiny: a full send buffer means the peer stopped reading.
      kill(fmt::format("sending failed: {}", n < 0 ? std::strerror(errno) : "closed"));
      return;
    }
  }
  last_sent_ = Clock::now();
}

std::vector<nlohmann::json> NodeLink::receive() {
  std::vector<nlohmann::json> out;
  char buf[8192];
  while (fd_ >= 0) {
    ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      inbox_.append(buf, static_cast<std::size_t>(n));
      last_received_ = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    kill(n == 0 ? "the connection was closed" : std::strerror(errno));
  }
  std::size_t start = 0;
  for (auto nl = inbox_.find('\n'); nl != std::string::npos; nl = inbox_.find('\n', start)) {
    auto message = nlohmann::json::parse(inbox_.substr(start, nl - start), nullptr, false);
    start = nl + 1;
    if (message.is_discarded() || !message.is_object()) {
      kill("it sent something that is not a ddprun message");
      return out;
    }
    if (message.value("type", "") == "closing") {  // its last words: why it hung up
      kill("closed");
      why_dead_ = "the other side closed the link: " + message.value("why", std::string("?"));
      inbox_.clear();
      return out;
    }
    if (message.value("type", "") != "ping") out.push_back(std::move(message));
  }
  inbox_.erase(0, start);
  if (inbox_.size() > kMaxMessage) kill("it sent an oversized message");
  return out;
}

void NodeLink::tick() {
  if (fd_ < 0) return;
  const auto now = Clock::now();
  if (now - last_received_ > silence_limit_) {
    const double silent = std::chrono::duration<double>(now - last_received_).count();
    // Best effort: a peer that was only paused (SIGSTOP, a long swap) reads
    // why it was dropped rather than a bare closed connection.
    const std::string bye =
        nlohmann::json{{"type", "closing"},
                       {"why", fmt::format("it heard nothing from this side for {:.1f} s "
                                           "(keep_alive_interval * keep_alive_max_attempt) "
                                           "and gave up on it",
                                           silent)}}
            .dump() +
        "\n";
    (void)::send(fd_, bye.data(), bye.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    kill(fmt::format("no message for {:.1f} s (keep_alive_interval * "
                     "keep_alive_max_attempt)",
                     silent));
    return;
  }
  if (now - last_sent_ >= interval_) send({{"type", "ping"}});
}

int NodeLink::ms_until_tick() const {
  if (fd_ < 0) return 1000;
  const auto now = Clock::now();
  auto next = std::min(last_sent_ + interval_, last_received_ + silence_limit_);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::clamp<long>(ms + 1, 1, 1000));
}

nlohmann::json to_json(const FailureReport& r) {
  return {{"node_rank", r.node_rank}, {"host", r.host},
          {"rank", r.rank},           {"local_rank", r.local_rank},
          {"pid", r.pid},             {"exit_code", r.exit_code},
          {"signal", r.signal},       {"time", r.time},
          {"stderr_tail", r.stderr_tail}, {"error_file", r.error_file},
          {"error_message", r.error_message},
          {"stopped_after_error", r.stopped_after_error}};
}

FailureReport failure_from_json(const nlohmann::json& j) {
  FailureReport r;
  r.node_rank = j.value("node_rank", -1);
  r.host = j.value("host", "");
  r.rank = j.value("rank", -1);
  r.local_rank = j.value("local_rank", -1);
  r.pid = j.value("pid", 0L);
  r.exit_code = j.value("exit_code", -1);
  r.signal = j.value("signal", 0);
  r.time = j.value("time", 0.0);
  r.stderr_tail = j.value("stderr_tail", std::vector<std::string>{});
  r.error_file = j.value("error_file", "");
  r.error_message = j.value("error_message", "");
  r.stopped_after_error = j.value("stopped_after_error", false);
  return r;
}

}  // namespace ddp::launcher
