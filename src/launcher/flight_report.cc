#include "launcher/flight_report.h"

#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "flight/flight_format.h"
#include "flight/flight_home.h"
#include "flight/flight_trace.h"
#include "flight/flight_verdict.h"
#include "launcher/group_support.h"

namespace ddp::launcher {
namespace {

// Copies the rings' files into `to` (created). Returns "" or why not.
std::string copy_rings(const std::vector<flight::RankTrace>& traces, const std::string& to) {
  try {
    make_directories(to);
    for (const flight::RankTrace& t : traces) {
      const std::string name = t.path.substr(t.path.rfind('/') + 1);
      std::ifstream in(t.path, std::ios::binary);
      if (!in) return fmt::format("could not read {}", t.path);
      std::ofstream out(to + "/" + name, std::ios::binary | std::ios::trunc);
      out << in.rdbuf();
      if (!out.flush()) return fmt::format("could not write {}/{}", to, name);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::string flight_dir_of_attempt(const std::string& attempt_dir) {
  return attempt_dir + "/flight";
}

std::string flight_report(const std::string& dir, const std::string& copy_to,
                          const std::vector<int>& pids, const flight::AttemptFacts& facts,
                          bool* copy_failed) {
  std::vector<flight::RankTrace> traces;
  std::vector<std::string> skipped;
  try {
    traces = flight::read_trace_dir(dir, &skipped);
  } catch (const std::exception&) {
    return "";  // no directory: no ddp process group was created
  }
  traces.erase(std::remove_if(traces.begin(), traces.end(),
                              [&](const flight::RankTrace& t) {
                                return !pids.empty() &&
                                       std::find(pids.begin(), pids.end(), t.pid) == pids.end();
                              }),
               traces.end());
  if (traces.empty() && skipped.empty()) return "";
  // Note [Kept flight records]: a failure before the first collective or
  // after the last (a bad flag, a missing file) leaves rings that say
  // nothing; they are neither kept nor judged.
  if (skipped.empty() && !flight::collective_involved(traces)) return "";
  std::string kept = dir, note;
  if (!copy_to.empty()) {
    const std::string error = copy_rings(traces, copy_to);
    if (error.empty()) {
      kept = copy_to;
      flight::prune_records_home();
    } else {
      *copy_failed = true;
      note = fmt::format("  (not copied to {}: {}; the run directory is kept instead)\n", copy_to,
                         error);
    }
  }
  std::string out = fmt::format("flight records of this node's ranks in {} (read them with "
                                "ddp-trace {}; --json for every collective):\n",
                                kept, kept) +
                    note;
  std::string text = flight::verdict(traces, facts);
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += "  " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  for (const std::string& s : skipped) out += "  skipped " + s + "\n";
  return out;
}

}  // namespace ddp::launcher
