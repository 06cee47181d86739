#include "launcher/net.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/error.h"
#include "port_holder.h"

namespace ddp::launcher {
namespace {

// A socket bound to `port` on every interface: IPv6 dual-stack where the
// host has IPv6, IPv4 otherwise. Returns -1 with errno set on failure.
int bind_any(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1, zero = 0;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    int e = errno;
    close(fd);
    if (e != EAFNOSUPPORT && e != EADDRNOTAVAIL) {
      errno = e;
      return -1;
    }
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}

InvalidArgument port_taken(int port, const std::string& reason) {
  const std::string holder = detail::port_holder(port);
  return InvalidArgument(fmt::format(
      "--master-port {} cannot be used on this host ({}): {} holds it. Pass a "
      "free port with --master-port, or use --standalone on a single node",
      port, reason, holder.empty() ? "another job or a previous run" : holder));
}

// Waits for a non-blocking connect; returns 0 or the errno of the failure.
int finish_connect(int fd, int timeout_ms) {
  pollfd p{fd, POLLOUT, 0};
  int r;
  do {
    r = poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err;
}

}  // namespace

std::string port_unavailable_reason(int port) {
  int fd = bind_any(port);
  if (fd < 0) return std::strerror(errno);
  close(fd);
  return "";
}

void check_master_port(int port) {
  std::string reason = port_unavailable_reason(port);
  if (!reason.empty()) throw port_taken(port, reason);
}

int pick_free_port() {
  int fd = bind_any(0);
  if (fd < 0) {
    throw Error(fmt::format("ddprun: could not bind any TCP port: {}",
                            std::strerror(errno)));
  }
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return a.ss_family == AF_INET6
             ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
             : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

int listen_on(int port) {
  int fd = bind_any(port);
  if (fd < 0) throw port_taken(port, std::strerror(errno));
  if (listen(fd, 128) != 0) {
    int e = errno;
    close(fd);
    throw port_taken(port, std::strerror(e));
  }
  return fd;
}

int try_listen_on(int port) {
  int fd = bind_any(port);
  if (fd < 0) {
    if (errno == EADDRINUSE) return -1;
    throw port_taken(port, std::strerror(errno));
  }
  if (listen(fd, 128) != 0) {
    int e = errno;
    close(fd);
    if (e == EADDRINUSE) return -1;
    throw port_taken(port, std::strerror(e));
  }
  return fd;
}

bool is_local_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Only an address of this machine can be bound (EADDRNOTAVAIL else).
    local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

int connect_to(const std::string& host, int port, int timeout_ms,
               std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (g != 0) {
    error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(g));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int e = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (e == EINPROGRESS) e = finish_connect(fd, timeout_ms);
    if (e != 0) {
      error = std::strerror(e);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace ddp::launcher
