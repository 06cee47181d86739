#include "interrupt.h"

#include <ATen/ops/full.h>

#include <atomic>
#include <csignal>
#include <string>

#include "ddp/collectives.h"

namespace ddp::train {
namespace {

std::atomic<int> g_signal{0};  // the first signal received; 0: none

extern "C" void record_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // lock-free: async-signal-safe
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: a second signal takes the default action (Note
  // [Interrupted training]); SA_RESTART: reads and waits go on.
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
}

int agreed_interrupt() {
  at::Tensor t = at::full({1}, g_signal.load(), at::kInt);
  all_reduce(t, ReduceOp::MAX);
  return t.item<int>();
}

const char* interrupt_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local std::string text;
  text = "signal " + std::to_string(sig);
  return text.c_str();
}

}  // namespace ddp::train
