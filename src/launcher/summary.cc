#include "launcher/summary.h"

#include <fmt/format.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/signals.h"

namespace ddp::launcher {
namespace {

const std::string kRule(72, '=');
const std::string kThinRule(72, '-');

std::string local_time(double seconds) {
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

void indent_lines(std::string& out, const std::string& text, const char* lead) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out += fmt::format("{}{}\n", lead, line);
}

}  // namespace

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string describe_end(int exit_code, int signal) {
  if (signal != 0) return fmt::format("signal {} ({})", signal_name(signal), signal);
  return fmt::format("exit code {}", exit_code);
}

std::string read_error_message(const std::string& path) {
  std::ifstream in(path);
  std::stringstream raw;
  raw << in.rdbuf();
  try {
    auto j = nlohmann::json::parse(raw.str());
    const auto& m = j.at("message");
    if (m.is_string()) return m.get<std::string>();
    std::string text = m.value("message", std::string());
    if (m.contains("extraInfo") && m["extraInfo"].contains("py_callstack")) {
      const auto& stack = m["extraInfo"]["py_callstack"];
      // ddp programs repeat the message there (torchrun shows only this).
      if (stack.is_string() && stack.get<std::string>() != text) {
        text += "\n" + stack.get<std::string>();
      }
    }
    return text;
  } catch (const std::exception& e) {
    return fmt::format("(could not read the error file: {}) {}", e.what(),
                       raw.str().substr(0, 500));
  }
}

void read_error_facts(WorkerResult& w) {
  if (w.error_file.empty()) return;
  try {
    std::ifstream in(w.error_file);
    const auto j = nlohmann::json::parse(in);
    const auto& extra = j.at("message").at("extraInfo");
    if (extra.contains("ddp_timestamp_us")) {
      w.error_time = std::stod(extra["ddp_timestamp_us"].get<std::string>()) / 1e6;
    }
    w.lost_peer = extra.value("ddp_lost_peer", std::string("0")) == "1";
    w.consequence = extra.value("ddp_consequence", std::string());
  } catch (const std::exception&) {
    // torchrun's format without our fields, or unreadable: the end time counts
  }
}

int pick_root_cause(const std::vector<WorkerResult>& workers, int first_seen) {
  auto candidate = [](const WorkerResult& w) {
    return w.end == WorkerEnd::kFailed || (w.end == WorkerEnd::kStopped && w.error_time > 0);
  };
  auto key = [](const WorkerResult& w) {
    return std::make_pair(w.lost_peer ? 1 : 0, w.error_time > 0 ? w.error_time : w.end_time);
  };
  int best = first_seen;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (!candidate(workers[i])) continue;
    if (best < 0 || key(workers[i]) < key(workers[best])) best = static_cast<int>(i);
  }
  return best;
}

FailureReport make_failure_report(const WorkerResult& w, int node_rank) {
  FailureReport r;
  r.node_rank = node_rank;
  r.host = host_name();
  r.rank = w.rank;
  r.local_rank = w.local_rank;
  r.pid = w.pid;
  r.exit_code = w.exit_code;
  r.signal = w.signal;
  r.time = w.error_time > 0 ? w.error_time : w.end_time;
  r.stopped_after_error = w.end == WorkerEnd::kStopped;
  r.stderr_tail = w.stderr_tail;
  r.error_file = w.error_file;
  if (!w.error_file.empty()) r.error_message = read_error_message(w.error_file);
  return r;
}

std::string root_cause_line(const FailureReport& r) {
  return fmt::format("rank {} (local_rank {}) on node {} ({}) failed: {}", r.rank,
                     r.local_rank, r.node_rank, r.host,
                     r.stopped_after_error
                         ? "it recorded its error first, then ended (" +
                               describe_end(r.exit_code, r.signal) +
                               ") while ddprun stopped the group"
                         : describe_end(r.exit_code, r.signal));
}

// ", a consequence: it lost its connection to a failed rank", or "".
std::string consequence_clause(const WorkerResult& w) {
  if (!w.lost_peer) return "";
  return ", a consequence: " +
         (w.consequence.empty() ? std::string("it lost its connection to a failed rank")
                                : w.consequence);
}

std::string describe_worker(const WorkerResult& w) {
  switch (w.end) {
    case WorkerEnd::kSucceeded: return "finished (exit code 0)";
    case WorkerEnd::kStopped:
      return fmt::format("stopped by ddprun ({}){}{}", describe_end(w.exit_code, w.signal),
                         w.error_time > 0 ? " after recording an error" : "",
                         w.error_time > 0 ? consequence_clause(w) : "");
    case WorkerEnd::kFailed:
      return fmt::format("failed too ({}){}", describe_end(w.exit_code, w.signal),
                         consequence_clause(w));
    case WorkerEnd::kRunning: break;
  }
  return fmt::format("still running after SIGKILL (pid {})", w.pid);
}

std::string format_summary(const std::string& title, const FailureReport& r,
                           const std::vector<WorkerResult>& others,
                           const std::vector<std::string>& notes) {
  std::string out = kRule + "\n";
  out += fmt::format("ddprun: {}\n", title);
  out += fmt::format("Root cause (first observed failure): {}\n", root_cause_line(r));
  out += fmt::format("  rank       : {} (local_rank {}, node {})\n", r.rank,
                     r.local_rank, r.node_rank);
  out += fmt::format("  host       : {}\n", r.host);
  out += fmt::format("  exit       : {} (pid {})\n", describe_end(r.exit_code, r.signal), r.pid);
  out += fmt::format("  time       : {}{}\n", local_time(r.time),
                     r.error_file.empty() ? "" : " (its error)");
  out += fmt::format("  error_file : {}\n", r.error_file.empty() ? "<none>" : r.error_file);
  if (!r.error_message.empty()) {
    out += "  message    :\n";
    indent_lines(out, r.error_message, "    ");
  }
  out += r.stderr_tail.empty() ? "  stderr     : <empty>\n"
                               : "  stderr (last lines):\n";
  for (const std::string& line : r.stderr_tail) out += "    | " + line + "\n";
  out += kThinRule + "\nOther ranks:\n";
  for (const WorkerResult& w : others) {
    if (w.rank == r.rank && w.pid == r.pid) continue;  // the root cause
    out += fmt::format("  rank {} (local_rank {}): {}\n", w.rank, w.local_rank,
                       describe_worker(w));
  }
  for (const std::string& note : notes) out += "  " + note + "\n";
  out += kRule + "\n";
  return out;
}

}  // namespace ddp::launcher
