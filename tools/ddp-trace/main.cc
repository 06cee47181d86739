// ddp-trace: the verdict over the flight records of a failed or hung job.
//
//   ddp-trace ~/.local/state/ddp/flight/ddprun_job_x1Y2_attempt_0   (a directory)
//   ddp-trace rank0.bin rank1.bin                          (files; hosts' copies)
//   ddp-trace --json DIR                                    (every collective)
//
// Exit status: 0 when it read at least one record, 2 otherwise (bad usage,
// nothing readable).
#include <CLI/CLI.hpp>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/usage_error.h"
#include "flight/flight_home.h"
#include "flight/flight_trace.h"
#include "flight/flight_verdict.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-trace: which rank is behind, on which collective, and what the others wait for, "
      "from the flight records (ddp_flight_<group>_rank<R>.bin) of every rank"};
  std::vector<std::string> paths;
  bool json = false, all = false;
  app.add_option("paths", paths,
                 "Directories holding flight records (DDP_FLIGHT_RECORDER_DIR, or the one ddprun "
                 "names after a failure) or record files; several hosts' copies may be mixed")
      ->required();
  app.add_flag("--json", json, "Print every entry of every rank as JSON instead of the verdict");
  app.add_flag("--all", all, "After the verdict, every rank's entries, oldest first");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << ddp::cli::usage_error("ddp-trace", app, e,
                                       std::vector<std::string>(argv + 1, argv + argc))
              << "\n";
    return ddp::cli::kUsageExit;
  }
  std::vector<ddp::flight::RankTrace> traces;
  std::vector<std::string> problems;
  for (const std::string& p : paths) {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) {
      problems.push_back(p + ": " + std::strerror(errno));
      continue;
    }
    try {
      if (S_ISDIR(st.st_mode)) {
        const size_t before = problems.size();
        auto more = ddp::flight::read_trace_dir(p, &problems);
        if (more.empty() && problems.size() == before) {
          problems.push_back(p + ": no ddp_flight_*.bin file in it (ddprun's kept run "
                                 "directories hold them in attempt_<K>/flight)");
        }
        traces.insert(traces.end(), more.begin(), more.end());
      } else {
        traces.push_back(ddp::flight::read_trace(p));
      }
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  for (const std::string& p : problems) std::cerr << "ddp-trace: " << p << "\n";
  if (traces.empty()) {
    if (json) std::cout << "[]\n";
    std::cerr << "ddp-trace: no flight record read. Records are written under "
                 "DDP_FLIGHT_RECORDER_DIR when it is set (ddprun: its run directory), else, when "
                 "a collective is involved, under "
              << ddp::flight::records_home() << " (ddprun's copies of a failed attempt's, "
                 "and a program's own at an event)\n";
    return 2;
  }
  if (json) {
    std::cout << ddp::flight::to_json(traces) << "\n";
    return 0;
  }
  std::cout << ddp::flight::verdict(traces);
  if (all) {
    for (const auto& t : traces) {
      std::cout << "\n" << t.group << " rank " << t.rank << " (" << t.path << "):\n";
      for (const auto& e : t.entries) std::cout << "  " << ddp::flight::describe_entry(e) << "\n";
    }
  }
  return 0;
}
