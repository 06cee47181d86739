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
// Terminal: clear from the cursor to the end of the line.
constexpr std::string_view kClearToEnd = "\x1b[K";

// Note [Carriage-return updates]
// A worker that knows it talks to a terminal (DDP_TERMINAL=1 from ddprun)
// redraws a progress bar with "\r...". With a prefix on a terminal console
// the relay shows each such piece in place as "\r[rankN]:piece" + clear to
// the end of the line, and the console's last line is then "open", owned by
// that stream. While it is open:
//  - a whole line from another stream clears it, is written, and the open
//    line is redrawn after it: the bar stays the bottom line, never mixed
//    into another rank's text;
//  - the owner's next "\n" ends it (an empty line: the bar as last drawn
//    stays; a non-empty one replaces it);
//  - text after a "\r" is drawn as soon as it arrives, not when the next
//    "\r" ends it (bars are written "\r<bar>" as often as "<bar>\r");
//  - another stream's "\r" update first ends it with a newline;
//  - the owner's end of stream, or a message of the launcher's own
//    (end_open_console_line), ends it with a newline.
// One event-loop thread runs the relay, so this state needs no lock.
struct OpenLine {
  uint64_t owner = 0;  // 0: no open line
  int fd = -1;
  std::string text;    // as last drawn, for the redraw
};
OpenLine open_line;
uint64_t next_stream_id = 1;

void end_open_line() {
  if (open_line.owner == 0) return;
  write_all(open_line.fd, "\n");
  open_line = OpenLine{};
}

}  // namespace

void end_open_console_line() { end_open_line(); }

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
  end_open_line();
  std::string text = "ddprun: ";
  text.append(line);
  text.push_back('\n');
  write_all(STDERR_FILENO, text);
}

OutputStream::OutputStream(int fd, StreamRoute route)
    : fd_(fd), id_(next_stream_id++), route_(std::move(route)) {
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
      id_(other.id_),
      log_fd_(other.log_fd_),
      route_(std::move(other.route_)),
      pending_(std::move(other.pending_)),
      after_cr_(other.after_cr_),
      tail_(std::move(other.tail_)) {
  other.fd_ = -1;
  other.id_ = 0;
  other.log_fd_ = -1;
}

OutputStream::~OutputStream() { close(); }

void OutputStream::read_available() { read_some(8); }

// Bounded: a pipe holds at most a few hundred KiB once its writer is gone;
// a writer still alive cannot keep us here for long.
void OutputStream::drain() { read_some(256); }

// Up to `max_reads` reads of what the pipe holds now; closes the stream at
// its end (or on a read error: treated alike).
void OutputStream::read_some(int max_reads) {
  char buf[16384];
  for (int i = 0; i < max_reads && fd_ >= 0; ++i) {
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
  const bool carriage = route_.terminal && route_.console_fd >= 0 && !route_.prefix.empty();
  std::size_t start = 0;
  while (true) {
    auto end = pending_.find_first_of(carriage ? "\r\n" : "\n", start);
    if (end == std::string::npos) break;
    std::string_view piece = std::string_view(pending_).substr(start, end - start);
    start = end + 1;
    if (pending_[end] == '\n') {
      line(piece);
      after_cr_ = false;
    } else if (start < pending_.size() && pending_[start] == '\n') {
      line(piece);  // "\r\n" ends a line
      ++start;
      after_cr_ = false;
    } else {
      update(piece);  // a "\r\n" split across reads ends as update + empty line
      after_cr_ = true;
    }
  }
  pending_.erase(0, start);
  // A bar drawn as "\r<text>" is complete when it arrives; its end is only
  // the next "\r" or "\n". Draw it now, or the console would always show the
  // previous update (Note [Carriage-return updates]).
  if (carriage && after_cr_ && !pending_.empty()) update(pending_);
  if (pending_.size() >= kMaxLine) {
    line(pending_);
    pending_.clear();
  }
}

void OutputStream::line(std::string_view text) {
  if (route_.console_fd >= 0 && !route_.prefix.empty()) {
    std::string out;
    out.reserve(route_.prefix.size() + text.size() + 8);
    const bool open = route_.terminal && open_line.owner != 0;
    if (open && open_line.owner == id_) {  // Note [Carriage-return updates]
      if (!text.empty()) out.append("\r").append(route_.prefix).append(text).append(kClearToEnd);
      out.push_back('\n');
      open_line = OpenLine{};
    } else {
      if (open) out.append("\r").append(kClearToEnd);
      out.append(route_.prefix).append(text).push_back('\n');
      if (open) out.append(open_line.text);
    }
    write_all(route_.console_fd, out);
  }
  if (route_.tail_lines > 0) {
    tail_.emplace_back(text.substr(0, kMaxTailLine));
    while (tail_.size() > route_.tail_lines) tail_.pop_front();
  }
}

void OutputStream::update(std::string_view text) {
  if (text.empty()) return;
  if (open_line.owner != id_) end_open_line();
  std::string out = "\r";
  out.append(route_.prefix).append(text).append(kClearToEnd);
  if (open_line.owner == id_ && open_line.text == out) return;  // drawn already
  open_line = OpenLine{id_, route_.console_fd, out};
  write_all(route_.console_fd, out);
}

void OutputStream::close() {
  if (!pending_.empty()) {
    line(pending_);
    pending_.clear();
  }
  if (id_ != 0 && open_line.owner == id_) end_open_line();
  if (fd_ >= 0) ::close(fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
  fd_ = -1;
  log_fd_ = -1;
}

std::vector<std::string> OutputStream::tail() const {
  return {tail_.begin(), tail_.end()};
}

}  // namespace ddp::launcher
