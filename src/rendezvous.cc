#include "rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "compat/torch_compat.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/logging.h"
#include "port_holder.h"
#include "rendezvous_arrival.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// The least time a TCP store connection is given, however little of the
// rendezvous timeout is left.
constexpr std::chrono::milliseconds kMinConnect{300};

void require_rank_and_size(const InitOptions& o, const std::string& method) {
  if (o.world_size < 1) {
    throw InvalidArgument(fmt::format(
        "init_method '{}' needs InitOptions::world_size >= 1 (got {})", method,
        o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgument(fmt::format(
        "init_method '{}' needs InitOptions::rank in [0, {}) (got {})", method,
        o.world_size, o.rank));
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// In-process stores for memory://name, shared by the threads of a process.
c10::intrusive_ptr<c10d::Store> memory_store(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, c10::intrusive_ptr<c10d::Store>> stores;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = stores[name];
  if (!s) s = c10::make_intrusive<c10d::HashStore>();
  return s;
}

// Whether something accepts a TCP connection at host:port within a moment:
// tells "no store is there yet" from "a program there never answers".
bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool accepted = false;
  for (addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      accepted = ::poll(&p, 1, 500) == 1 &&
                 ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  return accepted;
}

// A client that has not reached the store's host yet says so every
// `every` (0: never), as a rank waiting at the arrivals does. It reports from
// its own thread: c10d's client retries on its own schedule (for a 1 s
// timeout, two tries and a back-off: about 2.7 s), so a report made between
// attempts would come late, or not at all before the deadline.
class ConnectReporter {
 public:
  ConnectReporter(std::chrono::milliseconds every, std::string host, int port, int rank,
                  std::chrono::milliseconds timeout)
      : every_(every), host_(std::move(host)), port_(port), rank_(rank), timeout_(timeout) {
    if (every_.count() > 0) thread_ = std::thread([this] { run(); });
  }
  ConnectReporter(const ConnectReporter&) = delete;
  ConnectReporter& operator=(const ConnectReporter&) = delete;
  ~ConnectReporter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto next = start_ + every_; !cv_.wait_until(lock, next, [this] { return done_; });
         next += every_) {
      log(LogLevel::kWarning,
          fmt::format("rendezvous: rank {} is waiting for rank 0's store at {}:{} for {:.0f} s "
                      "(no store answers there yet); it gives up after {} s (the timeout). Is "
                      "rank 0 running, and are MASTER_ADDR/MASTER_PORT right?",
                      rank_, host_, port_,
                      std::chrono::duration<double>(Clock::now() - start_).count(),
                      seconds(timeout_)));
    }
  }

  const std::chrono::milliseconds every_;
  const std::string host_;
  const int port_, rank_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point start_ = Clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, int port,
                                          bool is_server,
                                          std::chrono::milliseconds timeout,
                                          int rank, std::chrono::milliseconds report_every) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = is_server;
  o.waitWorkers = false;  // we check arrivals ourselves, with better errors
  o.timeout = timeout;
  std::optional<ConnectReporter> report;
  if (!is_server) report.emplace(report_every, host, port, rank, timeout);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    try {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (auto store = compat::connect_tcp_store(host, o, std::max(left, kMinConnect))) {
        return store;
      }
      if (accepts_connections(host, port)) {
        throw TimeoutError(fmt::format(
            "rank {}: no rendezvous store answered at {}:{} within {} s. Is "
            "that rank 0's store, and not another program's port? Check "
            "MASTER_ADDR/MASTER_PORT",
            rank, host, port, seconds(timeout)));
      }
      throw TimeoutError(fmt::format(
          "rank {} could not reach the rendezvous store at {}:{} within {} s: "
          "nothing accepts connections there. Is rank 0 running, and are "
          "MASTER_ADDR/MASTER_PORT right?",
          rank, host, port, seconds(timeout)));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (is_server) {
        const std::string holder = port_holder(port);
        throw CommError(fmt::format(
            "rank {} could not host the rendezvous store on port {}: {}. The "
            "port is {}: set MASTER_PORT to a free port (or use ddprun --standalone)",
            rank, port, inner_message(e),
            holder.empty() ? "probably in use by another job or a previous run"
                           : "held by " + holder));
      }
      // c10d's client stops retrying about a second before its timeout
      // (at once for timeouts under ~2 s): retry until our own deadline.
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (left < std::chrono::milliseconds(300)) {
        throw TimeoutError(fmt::format(
            "rank {} could not reach the rendezvous store at {}:{} within {} "
            "s: {}. Is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?",
            rank, host, port, seconds(timeout), inner_message(e)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      o.timeout = left - std::chrono::milliseconds(250);
    }
  }
}

// Splits "tcp://host:port" into host and port; handles "[v6]:port".
std::pair<std::string, int> parse_host_port(const std::string& rest,
                                            const std::string& method) {
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 == rest.size()) {
    throw InvalidArgument(fmt::format(
        "init_method '{}' has no port: expected tcp://host:port", method));
  }
  std::string host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 1 || port > 65535) {
    throw InvalidArgument(fmt::format(
        "init_method '{}' has an invalid port '{}': expected 1..65535", method,
        rest.substr(colon + 1)));
  }
  return {host, static_cast<int>(port)};
}

std::string gloo_address_for(const std::string& options_address, const std::string& master_host,
                             const RendezvousInputs& in) {
  if (!options_address.empty()) return options_address;
  if (!in.gloo_socket_ifname.empty()) return "if:" + in.gloo_socket_ifname;
  if (!in.local_addr.empty()) return in.local_addr;
  if (master_host.empty()) return "";
  return local_address_towards(master_host);
}

// Keys of one group's rendezvous live under "ddp/<group>/<n>/", n counting
// the groups this rank created with that name, so re-initialising on a store
// that outlives a group (torchrun's agent store) starts afresh. `take`
// counts this one; false only looks.
std::string group_prefix(const InitOptions& o, int rank, bool take) {
  static std::mutex mu;
  static std::map<std::string, int> created;
  std::lock_guard<std::mutex> lock(mu);
  int& n = created[fmt::format("{}|{}|{}", o.init_method, o.group_name, rank)];
  return fmt::format("ddp/{}/{}", o.group_name, take ? n++ : n);
}

// The TCP store at host:port, hosted by this process when `server`.
c10::intrusive_ptr<c10d::Store> connect_tcp(const std::string& host, int port,
                                            bool server, const InitOptions& o,
                                            const Rendezvous& r) {
  try {
    return tcp_store(host, port, server, o.timeout, r.rank, r.report_every);
  } catch (const CommError&) {
    if (server) {
      claim_rank0_on_busy_port(host, port, group_prefix(o, r.rank, false),
                               r.size, r.address, o.timeout);
    }
    throw;
  }
}

// env://: rank and size from InitOptions where set, else the launcher's
// variables; torchrun's agent may host the store (see env.h).
c10::intrusive_ptr<c10d::Store> env_store(const InitOptions& o, const RendezvousInputs& in,
                                          Rendezvous& r, bool& hosts_store) {
  const LaunchEnv& env = in.launch;
  r.rank = o.rank >= 0 ? o.rank : env.rank;
  r.size = o.world_size >= 1 ? o.world_size : env.world_size;
  if (r.rank >= r.size) {
    throw InvalidArgument(fmt::format(
        "rank {} ({}) is not below the world size {} ({})", r.rank,
        o.rank >= 0 ? "InitOptions::rank" : "RANK", r.size,
        o.world_size >= 1 ? "InitOptions::world_size"
                          : "WORLD_SIZE, 1 when unset"));
  }
  r.address = fmt::format("{}:{}", env.master_addr, env.master_port);
  r.gloo_address = gloo_address_for(o.gloo_address, env.master_addr, in);
  const std::string& file = in.rendezvous_file;
  if (!file.empty() && !env.use_agent_store) {
    // ddprun --standalone: a file in its private run directory, so nothing
    // listens on the network (Gloo binds 127.0.0.1 for a loopback master).
    r.address = file;
    return c10::make_intrusive<c10d::FileStore>(file, r.size);
  }
  if (r.size == 1 && !env.use_agent_store) {
    // A world of one meets nobody: a store in this process, no port, so
    // that two single-process runs on one machine never collide on
    // MASTER_PORT.
    r.address = "an in-process store (world of one)";
    return c10::make_intrusive<c10d::HashStore>();
  }
  hosts_store = r.rank == 0 && !env.use_agent_store;
  r.tcp_host = env.master_addr;
  r.tcp_port = env.master_port;
  auto base = connect_tcp(env.master_addr, env.master_port, hosts_store, o, r);
  if (!env.use_agent_store) return base;
  r.tcp_prefix = fmt::format("/worker/attempt_{}", env.restart_count);
  return c10::make_intrusive<c10d::PrefixStore>(r.tcp_prefix, base);
}

// tcp://, file:// and memory://: rank and size from InitOptions.
c10::intrusive_ptr<c10d::Store> explicit_store(const InitOptions& o,
                                               const RendezvousInputs& in, Rendezvous& r,
                                               bool& hosts_store) {
  const std::string& m = o.init_method;
  require_rank_and_size(o, m);
  r.rank = o.rank;
  r.size = o.world_size;
  if (m.rfind("tcp://", 0) == 0) {
    auto [host, port] = parse_host_port(m.substr(6), m);
    r.address = fmt::format("{}:{}", host, port);
    r.gloo_address = gloo_address_for(o.gloo_address, host, in);
    hosts_store = r.rank == 0;
    r.tcp_host = host;
    r.tcp_port = port;
    return connect_tcp(host, port, hosts_store, o, r);
  }
  if (m.rfind("file://", 0) == 0) {
    r.address = m.substr(7);
    if (r.address.empty()) {
      throw InvalidArgument("init_method 'file://' needs a path: file:///abs/path");
    }
    r.gloo_address = gloo_address_for(o.gloo_address, "", in);
    return c10::make_intrusive<c10d::FileStore>(r.address, r.size);
  }
  r.address = m;
  r.gloo_address = gloo_address_for(o.gloo_address, "127.0.0.1", in);
  return memory_store(m.substr(9));
}

// The stall inspector's own connection to a TCP store (Note [Progress
// publication]): reads on it are bounded by kPublishTimeout (a wait() sets
// the socket's limit in c10d 1.13), so a store host that is stopped or cut
// off cannot block the thread that publishes progress or the rank that asks
// for a report. Null (no publication) when it cannot be opened.
c10::intrusive_ptr<c10d::Store> publish_store(const Rendezvous& r, const std::string& prefix) {
  constexpr std::chrono::milliseconds kPublishTimeout{5000};
  try {
    c10d::TCPStoreOptions po;
    po.port = static_cast<uint16_t>(r.tcp_port);
    po.isServer = false;
    po.waitWorkers = false;
    po.timeout = kPublishTimeout;
    c10::intrusive_ptr<c10d::Store> s = compat::connect_tcp_store(r.tcp_host, po, kPublishTimeout);
    if (!s) return {};
    if (!r.tcp_prefix.empty()) s = c10::make_intrusive<c10d::PrefixStore>(r.tcp_prefix, s);
    s = c10::make_intrusive<c10d::PrefixStore>(prefix, s);
    s->wait({}, kPublishTimeout);
    return s;
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

std::string local_address_towards(const std::string& host) {
  if (is_loopback(host)) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) {
    throw InvalidArgument(fmt::format(
        "MASTER_ADDR '{}' does not resolve to an IPv4 address", host));
  }
  std::string out = "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  // connect() on UDP sends nothing; it only picks the route and source IP.
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

Rendezvous rendezvous(const InitOptions& o, const RendezvousInputs& in) {
  if (o.timeout.count() <= 0) {
    throw InvalidArgument(fmt::format(
        "InitOptions::timeout must be > 0 (got {} ms)", o.timeout.count()));
  }
  const std::string& m = o.init_method;
  Rendezvous r;
  r.report_every = in.report_every;
  bool hosts_store = false;
  c10::intrusive_ptr<c10d::Store> base;
  if (m == "env://" || m.empty()) {
    base = env_store(o, in, r, hosts_store);
  } else if (m.rfind("tcp://", 0) == 0 || m.rfind("file://", 0) == 0 ||
             m.rfind("memory://", 0) == 0) {
    base = explicit_store(o, in, r, hosts_store);
  } else {
    throw InvalidArgument(fmt::format(
        "unknown init_method '{}': expected env://, tcp://host:port, "
        "file:///path or memory://name",
        m));
  }
  base->setTimeout(o.timeout);
  const std::string prefix = group_prefix(o, r.rank, true);
  r.store = c10::make_intrusive<c10d::PrefixStore>(prefix, base);
  const bool tcp = r.tcp_port != 0;
  // Note [Arrival protocol] (rendezvous_arrival.h).
  check_arrivals(
      Arrival{*r.store, r.rank, r.size, r.address, o.timeout, hosts_store, tcp, in.report_every});
  r.publish_store = tcp ? publish_store(r, prefix) : r.store;
  return r;
}

}  // namespace ddp::detail
