#include "launcher/relay.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/error.h"

namespace ddp::launcher {
namespace {

// A line longer than this is passed on in pieces (bounded memory).
constexpr std::size_t kMaxLine = 64 * 1024;
// Lines kept for the summary are cut to this many bytes.
constexpr std::size_t kMaxTailLine = 2000;

}  // namespace

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n > 0) {
      text.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else {
      return;  // EPIPE, EBADF, a full disk: drop the output, keep the job
    }
  }
}

void launcher_message(std::string_view line) {
  std::string text = "ddprun: ";
  text.append(line);
  text.push_back('\n');
  write_all(STDERR_FILENO, text);
}

OutputStream::OutputStream(int fd, StreamRoute route)
    : fd_(fd), route_(std::move(route)) {
  if (!route_.log_path.empty()) {
    log_fd_ = ::open(route_.log_path.c_str(),
                     O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0) {
      int e = errno;
      ::close(fd_);
      fd_ = -1;
      throw InvalidArgument(fmt::format(
          "could not create log file '{}': {}; check --log-dir",
          route_.log_path, std::strerror(e)));
    }
  }
}

OutputStream::OutputStream(OutputStream&& other) noexcept
    : fd_(other.fd_),
      log_fd_(other.log_fd_),
      route_(std::move(other.route_)),
      pending_(std::move(other.pending_)),
      tail_(std::move(other.tail_)) {
  other.fd_ = -1;
  other.log_fd_ = -1;
}

OutputStream::~OutputStream() { close(); }

void OutputStream::read_available() {
  char buf[16384];
  // A few reads per call, so one chatty worker cannot starve the others.
  for (int i = 0; i < 8 && fd_ >= 0; ++i) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n > 0) {
      route(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close();  // end of stream (or a read error: treat alike)
    }
  }
}

void OutputStream::drain() {
  char buf[16384];
  // Bounded: a pipe holds at most a few hundred KiB once its writer is gone;
  // a writer still alive cannot keep us here for long.
  for (int i = 0; i < 256 && fd_ >= 0; ++i) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n > 0) {
      route(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close();
    }
  }
}

void OutputStream::route(const char* data, std::size_t n) {
  if (log_fd_ >= 0) write_all(log_fd_, std::string_view(data, n));
  const bool raw_console = route_.console_fd >= 0 && route_.prefix.empty();
  if (raw_console) write_all(route_.console_fd, std::string_view(data, n));
  const bool by_line = (route_.console_fd >= 0 && !route_.prefix.empty()) ||
                       route_.tail_lines > 0;
  if (!by_line) return;
  pending_.append(data, n);
  std::size_t start = 0;
  while (true) {
    auto nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    line(std::string_view(pending_).substr(start, nl - start));
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (pending_.size() >= kMaxLine) {
    line(pending_);
    pending_.clear();
  }
}

void OutputStream::line(std::string_view text) {
  if (route_.console_fd >= 0 && !route_.prefix.empty()) {
    std::string out;
    out.reserve(route_.prefix.size() + text.size() + 1);
    out.append(route_.prefix).append(text).push_back('\n');
    write_all(route_.console_fd, out);
  }
  if (route_.tail_lines > 0) {
    tail_.emplace_back(text.substr(0, kMaxTailLine));
    while (tail_.size() > route_.tail_lines) tail_.pop_front();
  }
}

void OutputStream::close() {
  if (!pending_.empty()) {
    line(pending_);
    pending_.clear();
  }
  if (fd_ >= 0) ::close(fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
  fd_ = -1;
  log_fd_ = -1;
}

std::vector<std::string> OutputStream::tail() const {
  return {tail_.begin(), tail_.end()};
}

}  // namespace ddp::launcher
