// One TCP connection between two launchers of a multi-node job (control.h):
// newline-delimited JSON messages, and heartbeats so that a node that
// vanishes (crashed host, cut cable) is noticed without waiting for TCP.
// The side that gives up on a silent peer sends "closing" with its reason
// first, so a peer that was only paused learns why it was dropped.
//
// Thread safety: not thread-safe; the launcher's event loop only.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/summary.h"

namespace ddp::launcher {

class NodeLink {
 public:
  using Clock = std::chrono::steady_clock;

  // Takes ownership of `fd`, a connected non-blocking socket. A ping goes out
  // every `keep_alive_interval` seconds without other traffic; the link is
  // dead after keep_alive_interval * max_attempts seconds of silence.
  NodeLink(int fd, double keep_alive_interval, int max_attempts);
  ~NodeLink();
  NodeLink(NodeLink&& other) noexcept;
  NodeLink& operator=(NodeLink&& other) noexcept;
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  int fd() const { return fd_; }
  bool alive() const { return fd_ >= 0; }
  const std::string& why_dead() const { return why_dead_; }

  // Sends one message; a failure (peer gone, buffer full) kills the link.
  void send(const nlohmann::json& message);
  // Reads what has arrived without blocking; returns the complete messages
  // (pings are swallowed). End of stream, errors and malformed messages
  // kill the link.
  std::vector<nlohmann::json> receive();
  // Sends a ping when one is due; kills the link after too long a silence.
  void tick();
  // Milliseconds until tick() has something to do.
  int ms_until_tick() const;
  // Closes the connection, recording `why`.
  void kill(const std::string& why);

  int node_rank = -1;  // the peer's node rank, once known
  std::string host;    // the peer's host name, once known

 private:
  int fd_ = -1;
  std::string inbox_;
  std::string why_dead_;
  Clock::duration interval_;
  Clock::duration silence_limit_;
  Clock::time_point last_sent_;
  Clock::time_point last_received_;
};

// FailureReport <-> JSON, for "fail" and "exit" messages.
nlohmann::json to_json(const FailureReport& report);
FailureReport failure_from_json(const nlohmann::json& j);

}  // namespace ddp::launcher
