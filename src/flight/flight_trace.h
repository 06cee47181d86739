// Reading flight records and saying what went wrong: ddp-trace's engine,
// also run by ddprun on a failed attempt. No libtorch.
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

// Every "ddp_flight_*.bin" directly in `dir`, sorted by group then rank;
// files that are not flight records are reported in `skipped` ("path:
// why"), not thrown. Throws InvalidArgument when `dir` cannot be listed.
std::vector<RankTrace> read_trace_dir(const std::string& dir, std::vector<std::string>* skipped);

// The verdict over every rank's ring: a few lines per process group, first
// the conclusion ("rank 1 is behind: ...", "collective #7 differs across
// ranks: ...", "every rank reached ..."), then one line per rank with its
// last collective, its state and any event. "" when `traces` is empty.
std::string verdict(const std::vector<RankTrace>& traces);

// One entry as a line: "#12 all_reduce of gradient bucket 0 of 2
// (iteration 4) [all_reduce SUM float32[1024]] step 4 bucket 0: timed out
// after 30.00 s".
std::string describe_entry(const TraceEntry& e);

// All entries of all traces as JSON (ddp-trace --json).
std::string to_json(const std::vector<RankTrace>& traces);

}  // namespace ddp::flight
