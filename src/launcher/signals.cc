#include "launcher/signals.h"

#include <fmt/format.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/error.h"

namespace ddp::launcher {
namespace {

// The stop signals (--signals-to-handle); set before the SignalWatch.
std::vector<int>& stop_signals() {
  static std::vector<int> signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  return signals;
}

sigset_t watched_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : stop_signals()) sigaddset(&set, s);
  return set;
}

}  // namespace

SignalWatch::SignalWatch() {
  sigset_t set = watched_set();
  // pthread_sigmask returns its error number; it does not set errno.
  if (int e = pthread_sigmask(SIG_BLOCK, &set, &previous_mask_); e != 0) {
    throw Error(fmt::format("ddprun: could not block signals: {}", std::strerror(e)));
  }
  fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd_ < 0) {
    int e = errno;
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
    throw Error(fmt::format("ddprun: signalfd failed: {}", std::strerror(e)));
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous_pipe_);
}

SignalWatch::~SignalWatch() {
  close(fd_);
  sigaction(SIGPIPE, &previous_pipe_, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

std::vector<int> SignalWatch::read_pending() {
  std::vector<int> out;
  signalfd_siginfo info{};
  while (true) {
    ssize_t n = ::read(fd_, &info, sizeof(info));
    if (n == static_cast<ssize_t>(sizeof(info))) {
      out.push_back(static_cast<int>(info.ssi_signo));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: nothing more
  }
  return out;
}

void set_stop_signals(const std::vector<int>& signals) { stop_signals() = signals; }

bool is_stop_signal(int sig) {
  for (int s : stop_signals()) {
    if (s == sig) return true;
  }
  return false;
}

std::string signal_name(int sig) {
  if (const char* abbrev = sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return fmt::format("signal {}", sig);
}

void reset_signals_in_child() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGPIPE, &dfl, nullptr);
}

}  // namespace ddp::launcher
