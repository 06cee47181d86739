// The launcher's signals, read synchronously through a signalfd so that the
// single-threaded event loop (worker_group.h) sees worker exits (SIGCHLD)
// and stop requests (SIGINT, SIGTERM, SIGHUP, SIGQUIT) in the order they
// came, with no handler racing the loop.
//
// Thread safety: one SignalWatch per process, created on the main thread
// before any other thread starts (threads inherit the blocked mask).
#pragma once

#include <csignal>
#include <string>
#include <vector>

namespace ddp::launcher {

class SignalWatch {
 public:
  // Blocks SIGCHLD and the stop signals in the calling thread, opens the
  // signalfd (non-blocking, close-on-exec) and ignores SIGPIPE so that a
  // closed console does not kill the launcher. Throws ddp::Error when the
  // signalfd cannot be created.
  SignalWatch();
  // Restores the previous mask and SIGPIPE disposition.
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return fd_; }
  // The signals that arrived since the last call, oldest first; never
  // blocks. Signals of one kind that arrive together may be merged (as
  // always with POSIX signals): reap children in a loop.
  std::vector<int> read_pending();

 private:
  int fd_ = -1;
  sigset_t previous_mask_{};
  struct sigaction previous_pipe_ {};
};

// The signals that stop the job and are forwarded to workers: SIGINT,
// SIGTERM, SIGHUP, SIGQUIT unless set_stop_signals (--signals-to-handle)
// chose others. Call set_stop_signals before creating the SignalWatch.
void set_stop_signals(const std::vector<int>& signals);
bool is_stop_signal(int sig);

// "SIGKILL", "SIGSEGV", ...; "signal 77" for numbers without a name.
std::string signal_name(int sig);

// In a forked child before exec (async-signal-safe): unblocks every signal
// and restores SIGPIPE's default action, undoing what SignalWatch did.
void reset_signals_in_child();

}  // namespace ddp::launcher
