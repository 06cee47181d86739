// Output relay: each worker's stdout and stderr arrive on pipes and go to
// the console (whole lines, prefixed "[rankN]:" when several ranks share
// the console), to per-rank log files, or both (--tee), and the last stderr
// lines are kept for the failure summary.
//
// Why whole lines: the launcher is the only writer of its console and writes
// each prefixed line with one write() call from one thread, so lines of
// different ranks never mix mid-line (a line longer than 64 KiB is passed on
// in 64 KiB pieces, each a line of its own). Without a prefix (a single rank on
// the console) bytes pass through as they come, so prompts and progress bars
// without a newline still show. With a prefix on a terminal, carriage-return
// updates (progress bars) show in place: Note [Carriage-return updates].
//
// Thread safety: not thread-safe; used by the launcher's event loop only.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

// Writes all of `text` to fd, retrying on EINTR and short writes and waiting
// while a non-blocking fd is full. Stops quietly once the reader is gone
// (EPIPE): a closed console must not stop the job.
void write_all(int fd, std::string_view text);

// ddprun's own messages: "ddprun: " + line + "\n" on stderr, one write.
void launcher_message(std::string_view line);

struct StreamRoute {
  int console_fd = -1;     // 1 or 2; -1: not shown on the console
  std::string prefix;      // "[rank3]:", or empty for no prefix
  std::string log_path;    // file to write (created, truncated); empty: none
  std::size_t tail_lines = 0;  // last lines kept for tail()
  // The console is a terminal: with a prefix, "\r" updates are drawn in
  // place (Note [Carriage-return updates]); elsewhere "\r" is an ordinary
  // byte of the line.
  bool terminal = false;
};

// Ends a carriage-return line left open on the console (a progress bar), so
// that the launcher's own message starts on a line of its own.
void end_open_console_line();

class OutputStream {
 public:
  // Takes ownership of `fd` (a non-blocking pipe read end) and opens the
  // log file. Throws ddp::InvalidArgument naming the path when the log file
  // cannot be created.
  OutputStream(int fd, StreamRoute route);
  ~OutputStream();
  OutputStream(OutputStream&& other) noexcept;
  OutputStream& operator=(OutputStream&&) = delete;
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;

  int fd() const { return fd_; }  // -1 once closed
  bool is_open() const { return fd_ >= 0; }
  // Reads what is available without blocking and routes it. At end of
  // stream (every writer closed the pipe) it closes the stream.
  void read_available();
  // Reads until the pipe is empty right now (what an exited worker wrote
  // before exiting is all there), without blocking.
  void drain();
  // Routes a last unterminated line and closes the pipe and the log file.
  void close();
  // The last `tail_lines` complete lines (without newline), oldest first.
  std::vector<std::string> tail() const;

 private:
  void read_some(int max_reads);  // a few reads per call: no stream starves the others
  void route(const char* data, std::size_t n);
  void line(std::string_view text);
  void update(std::string_view text);  // a "\r"-terminated piece

  int fd_ = -1;
  uint64_t id_ = 0;  // identifies the owner of the open console line
  int log_fd_ = -1;
  StreamRoute route_;
  std::string pending_;  // an unterminated line
  bool after_cr_ = false;  // pending_ follows a "\r": a bar being drawn
  std::deque<std::string> tail_;
};

}  // namespace ddp::launcher
