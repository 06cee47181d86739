#include "rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "compat/torch_compat.h"
#include "ddp/env.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(std::chrono::milliseconds d) { return d.count() / 1000.0; }

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

c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, int port,
                                          bool is_server,
                                          std::chrono::milliseconds timeout,
                                          int rank) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = is_server;
  o.waitWorkers = false;  // we check arrivals ourselves, with better errors
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    std::string msg = compat::what_without_backtrace(e);
    if (is_server) {
      throw CommError(fmt::format(
          "rank {} could not host the rendezvous store on port {}: {}. The "
          "port is probably in use by another job or a previous run: set "
          "MASTER_PORT to a free port (or use ddprun --standalone)",
          rank, port, msg));
    }
    throw TimeoutError(fmt::format(
        "rank {} could not reach the rendezvous store at {}:{} within {} s: "
        "{}. Is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?",
        rank, host, port, seconds(timeout), msg));
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

std::string gloo_address_for(const std::string& options_address,
                             const std::string& master_host) {
  if (!options_address.empty()) return options_address;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    std::string first(ifname);
    first = first.substr(0, first.find(','));
    if (!first.empty()) return "if:" + first;
  }
  if (master_host.empty()) return "";
  return local_address_towards(master_host);
}

// Keys of one group's rendezvous live under "<group>/<n>/", n counting the
// groups this rank created with that name, so re-initialising on a store
// that outlives a group (torchrun's agent store) starts afresh.
std::string group_prefix(const InitOptions& o, int rank) {
  static std::mutex mu;
  static std::map<std::string, int> created;
  std::lock_guard<std::mutex> lock(mu);
  int n = created[fmt::format("{}|{}|{}", o.init_method, o.group_name, rank)]++;
  return fmt::format("ddp/{}/{}", o.group_name, n);
}

void check_arrivals(c10d::Store& store, int rank, int size,
                    const std::string& address,
                    std::chrono::milliseconds timeout);

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

Rendezvous rendezvous(const InitOptions& o) {
  if (o.timeout.count() <= 0) {
    throw InvalidArgument(fmt::format(
        "InitOptions::timeout must be > 0 (got {} ms)", o.timeout.count()));
  }
  const std::string& m = o.init_method;
  Rendezvous r;
  c10::intrusive_ptr<c10d::Store> base;
  if (m == "env://" || m.empty()) {
    LaunchEnv env = read_launch_env();
    r.rank = o.rank >= 0 ? o.rank : env.rank;
    r.size = o.world_size >= 1 ? o.world_size : env.world_size;
    if (r.rank >= r.size) {
      throw InvalidArgument(fmt::format(
          "RANK={} is not below WORLD_SIZE={}", r.rank, r.size));
    }
    r.address = fmt::format("{}:{}", env.master_addr, env.master_port);
    bool server = r.rank == 0 && !env.use_agent_store;
    base = tcp_store(env.master_addr, env.master_port, server, o.timeout, r.rank);
    if (env.use_agent_store) {
      base = c10::make_intrusive<c10d::PrefixStore>(
          fmt::format("/worker/attempt_{}", env.restart_count), base);
    }
    r.gloo_address = gloo_address_for(o.gloo_address, env.master_addr);
  } else if (m.rfind("tcp://", 0) == 0) {
    require_rank_and_size(o, m);
    auto [host, port] = parse_host_port(m.substr(6), m);
    r.rank = o.rank;
    r.size = o.world_size;
    r.address = fmt::format("{}:{}", host, port);
    base = tcp_store(host, port, r.rank == 0, o.timeout, r.rank);
    r.gloo_address = gloo_address_for(o.gloo_address, host);
  } else if (m.rfind("file://", 0) == 0) {
    require_rank_and_size(o, m);
    r.rank = o.rank;
    r.size = o.world_size;
    r.address = m.substr(7);
    if (r.address.empty()) {
      throw InvalidArgument("init_method 'file://' needs a path: file:///abs/path");
    }
    base = c10::make_intrusive<c10d::FileStore>(r.address, r.size);
    r.gloo_address = gloo_address_for(o.gloo_address, "");
  } else if (m.rfind("memory://", 0) == 0) {
    require_rank_and_size(o, m);
    r.rank = o.rank;
    r.size = o.world_size;
    r.address = m;
    base = memory_store(m.substr(9));
    r.gloo_address = gloo_address_for(o.gloo_address, "127.0.0.1");
  } else {
    throw InvalidArgument(fmt::format(
        "unknown init_method '{}': expected env://, tcp://host:port, "
        "file:///path or memory://name",
        m));
  }
  base->setTimeout(o.timeout);
  r.store = c10::make_intrusive<c10d::PrefixStore>(group_prefix(o, r.rank), base);
  check_arrivals(*r.store, r.rank, r.size, r.address, o.timeout);
  return r;
}

namespace {

// Every rank registers "rank/<r>" then bumps "arrived"; a rank that finds
// its rank key already taken reports it under "error" for everyone.
void check_arrivals(c10d::Store& store, int rank, int size,
                    const std::string& address,
                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  try {
    if (store.add(fmt::format("rank/{}", rank), 1) > 1) {
      std::string msg = fmt::format(
          "two processes claim rank {} (world size {}) at the rendezvous {}: "
          "give each process a distinct RANK in [0, {})",
          rank, size, address, size);
      store.set("error", std::vector<uint8_t>(msg.begin(), msg.end()));
      throw InvalidArgument(msg);
    }
    store.add("arrived", 1);
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      if (store.check({"error"})) {
        auto v = store.get("error");
        throw InvalidArgument(std::string(v.begin(), v.end()));
      }
      int64_t arrived = store.add("arrived", 0);
      if (arrived >= size) break;
      if (Clock::now() > deadline) {
        std::vector<int> missing;
        for (int i = 0; i < size; ++i) {
          if (!store.check({fmt::format("rank/{}", i)})) missing.push_back(i);
        }
        throw TimeoutError(fmt::format(
            "rendezvous at {} timed out after {} s on rank {}: {} of {} ranks "
            "arrived, {} missing (ranks {}). Start all WORLD_SIZE={} processes, "
            "or lower WORLD_SIZE",
            address, seconds(timeout), rank, arrived, size, size - arrived,
            fmt::join(missing, ", "), size));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rendezvous at {} failed on rank {}: {}",
                                address, rank,
                                compat::what_without_backtrace(e)));
  }
}

}  // namespace
}  // namespace ddp::detail
