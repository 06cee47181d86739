// Reading flight records back: ddp-trace's and ddprun's input (the verdict
// over them is flight_verdict.h). No libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flight/flight_format.h"

namespace ddp::flight {

// One entry as read back (owned strings, no guard).
struct TraceEntry {
  uint64_t id = 0, seq = 0;
  State state = State::kEmpty;
  int64_t step = -1;
  int32_t bucket = -1;
  int64_t start_us = 0, end_us = 0;
  std::string op, signature;
};

// One rank's ring of one process group, as read from its file.
struct RankTrace {
  std::string path;
  std::string group, backend, host;
  int rank = -1, world_size = 0, local_rank = -1, pid = 0;
  int64_t created_us = 0, event_us = 0;
  uint32_t capacity = 0, events = 0;
  uint64_t written = 0;
  std::string reason;               // the events noted ("" when none)
  std::vector<TraceEntry> entries;  // oldest first, torn entries left out
  int torn = 0;                     // entries skipped while being written
};

// Reads one ring file. Throws ddp::InvalidArgument naming the file when it
// is not a flight record (bad magic, version, sizes) or cannot be read.
RankTrace read_trace(const std::string& path);

// The same over a ring's bytes, read twice (`again`: the second read, or
// `bytes` when there was one): what read_trace does after reading, and
// what fuzz/flight_trace_fuzzer.cc feeds arbitrary bytes. `path` names the
// ring in errors.
RankTrace parse_trace(const std::string& bytes, const std::string& again,
                      const std::string& path);

// Every "ddp_flight_*.bin" directly in `dir`, sorted by group then rank;
// files that are not flight records are reported in `skipped` ("path:
// why"), not thrown. Throws InvalidArgument when `dir` cannot be listed.
std::vector<RankTrace> read_trace_dir(const std::string& dir, std::vector<std::string>* skipped);

// All entries of all traces as JSON (ddp-trace --json).
std::string to_json(const std::vector<RankTrace>& traces);

}  // namespace ddp::flight
