#include "ddp/logging.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <strings.h>

#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/process_group.h"
#include "ddp_env.h"
#include "env_names.h"
#include "log_level.h"

namespace ddp {
namespace {

std::mutex g_write_mu;
std::atomic<int> g_level{-1};  // -1: not yet read from DDP_LOG_LEVEL (once)

// The rank the launch environment gives this process (RANK, SLURM_PROCID,
// OMPI_COMM_WORLD_RANK); when the environment is malformed (say WORLD_SIZE),
// RANK alone if it is a number, else 0. The error itself comes from
// init_process_group, not from a log line.
int launch_rank() {
  try {
    return read_launch_env().rank;
  } catch (const Error&) {
    try {
      const auto rank = detail::env_int(env_names::kRank);
      return rank && *rank >= 0 && *rank <= INT32_MAX ? static_cast<int>(*rank) : 0;
    } catch (const Error&) {
      return 0;
    }
  }
}

// The rank for prefixes and the rank-0 filter: the thread's default group;
// before one exists (or after it is destroyed), the launch environment's, so
// that a process started with RANK=1 never labels itself rank 0.
int current_rank() {
  if (!is_initialized()) return launch_rank();
  try {
    return get_rank();
  } catch (const Error&) {
    return launch_rank();  // destroyed concurrently
  }
}

// Prefixes every line of `text` and terminates the last one.
std::string with_prefix(const std::string& prefix, const std::string& text) {
  std::string out;
  out.reserve(text.size() + prefix.size() + 1);
  size_t start = 0;
  do {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += prefix;
    out.append(text, start, end - start);
    out += '\n';
    start = end + 1;
  } while (start < text.size());
  return out;
}

// One write(2) per call where the kernel allows, after the stdio buffer of
// the same stream, so that lines keep their order relative to printf.
void write_all(FILE* stream, const std::string& bytes) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fflush(stream);
  int fd = fileno(stream);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed or full: dropped, see logging.h
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::string vformat(const char* format, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), format, args);
  out.resize(static_cast<size_t>(n));
  return out;
}

LogLevel level_from_env() {
  const std::string v = detail::read_ddp_env().log_level;
  if (v.empty()) return LogLevel::kInfo;
  try {
    return detail::parse_log_level(v, env_names::kLogLevel);
  } catch (const InvalidArgument& e) {
    write_all(stderr, std::string("ddp: ") + e.what() + "; using info\n");
    return LogLevel::kInfo;
  }
}

}  // namespace

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kOff: return "OFF";
  }
  return "?";
}

LogLevel detail::parse_log_level(const std::string& text, const std::string& what) {
  struct Name { const char* name; LogLevel level; };
  static const Name names[] = {
      {"debug", LogLevel::kDebug},     {"10", LogLevel::kDebug},
      {"info", LogLevel::kInfo},       {"20", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning},
      {"30", LogLevel::kWarning},      {"error", LogLevel::kError},
      {"40", LogLevel::kError},        {"off", LogLevel::kOff}};
  for (const Name& n : names) {
    if (strcasecmp(text.c_str(), n.name) == 0) return n.level;
  }
  throw InvalidArgument(what + "='" + text +
                        "' is not a log level: use one of debug, info, "
                        "warning, error, off (or 10, 20, 30, 40)");
}

LogLevel log_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v < 0) {
    int fresh = static_cast<int>(level_from_env());
    // Another thread may have read it (same result) or called set_log_level
    // (which wins): only replace the "unset" marker.
    g_level.compare_exchange_strong(v, fresh);
    v = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(v);
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) {
  return level != LogLevel::kOff &&
         static_cast<int>(level) >= static_cast<int>(log_level());
}

void print0(const std::string& text) {
  if (current_rank() != 0) return;
  write_all(stdout, with_prefix("", text));
}

void print0f(const char* format, ...) {
  if (current_rank() != 0) return;
  va_list args;
  va_start(args, format);
  std::string text = vformat(format, args);
  va_end(args);
  write_all(stdout, with_prefix("", text));
}

// "[rank1]: ", or "" when the launcher already prefixes every line with the
// rank (ddprun sets DDP_LOG_RANK_PREFIX=0 then), so lines do not read
// "[rank1]:[rank1]: ...". DDP_LOG_RANK_PREFIX is read once, at the first
// line that could carry the prefix (a launcher sets it before the start).
std::string rank_prefix() {
  static const bool prefixed = detail::read_ddp_env().log_rank_prefix;
  if (!prefixed) return "";
  return "[rank" + std::to_string(current_rank()) + "]: ";
}

void print_all(const std::string& text) {
  write_all(stdout, with_prefix(rank_prefix(), text));
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  write_all(stderr, with_prefix(rank_prefix() + to_string(level) + ": ", message));
}

void logf(LogLevel level, const char* format, ...) {
  if (!log_enabled(level)) return;
  va_list args;
  va_start(args, format);
  std::string text = vformat(format, args);
  va_end(args);
  log(level, text);
}

void log0(LogLevel level, const std::string& message) {
  if (!log_enabled(level) || current_rank() != 0) return;
  write_all(stderr, with_prefix(std::string(to_string(level)) + ": ", message));
}

void log0f(LogLevel level, const char* format, ...) {
  if (!log_enabled(level) || current_rank() != 0) return;
  va_list args;
  va_start(args, format);
  std::string text = vformat(format, args);
  va_end(args);
  log0(level, text);
}

}  // namespace ddp
