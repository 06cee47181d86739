// libFuzzer target: the flight recorder's reader and verdict (what ddp-trace
// and ddprun run over rings they find on disk, written by ranks that may
// have died mid-write, or by anything else named ddp_flight_*.bin).
//
// Input: one byte of launcher facts (an interrupting signal, which ranks
// failed or were stopped), one byte choosing where the second read of each
// ring differs from the first (a rank writing meanwhile: 0 = no
// difference), then up to four rings one after the other, each as long as
// its header's capacity says (the last one takes what is left).
// Contract checked on every input: each ring is either refused with
// ddp::InvalidArgument naming it, or read; the verdict over the rings read
// (and the JSON of ddp-trace --json) is produced without a crash, a hang or
// a sanitizer report, and the JSON parses back.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "flight/flight_trace.h"
#include "flight/flight_verdict.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "flight_trace_fuzzer: contract violated: %s\n", what);
  std::abort();
}

// The length of the ring starting at `data`: its header's ring_bytes, or
// everything left when that is unknown, larger, or absurd.
size_t ring_length(const uint8_t* data, size_t left) {
  if (left < sizeof(ddp::flight::Header)) return left;
  uint32_t capacity = 0;
  std::memcpy(&capacity, data + offsetof(ddp::flight::Header, capacity), sizeof capacity);
  if (capacity > 64) return left;
  return std::min(left, ddp::flight::ring_bytes(capacity));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t facts_byte = data[0], torn_byte = data[1];
  std::vector<ddp::flight::RankTrace> traces;
  size_t at = 2;
  for (int k = 0; k < 4 && at < size; ++k) {
    const size_t n = ring_length(data + at, size - at);
    const std::string bytes(reinterpret_cast<const char*>(data + at), n);
    const std::string name = "ring" + std::to_string(k);
    at += n;
    std::string again = bytes;
    if (torn_byte != 0 && !again.empty()) {
      again[(static_cast<size_t>(torn_byte) * 97) % again.size()] ^= 0x5a;
    }
    try {
      traces.push_back(ddp::flight::parse_trace(bytes, again, name));
    } catch (const ddp::InvalidArgument& e) {
      if (std::strstr(e.what(), name.c_str()) == nullptr) violated("error does not name the ring");
    }
  }
  ddp::flight::AttemptFacts facts;
  facts.interrupt_signal = (facts_byte & 0x80) ? 2 : 0;
  for (size_t r = 0; r < traces.size(); ++r) {
    ddp::flight::WorkerEnding w;
    w.pid = traces[r].pid;
    w.failed = (facts_byte >> r) & 1;
    w.stopped = !w.failed && ((facts_byte >> (r + 4)) & 1);
    w.exit_code = w.failed ? 3 : -1;
    facts.endings.push_back(w);
  }
  const std::string verdict = ddp::flight::verdict(traces, facts);
  (void)ddp::flight::collective_involved(traces);
  for (const auto& t : traces) {
    for (const auto& e : t.entries) (void)ddp::flight::describe_entry(e);
  }
  (void)verdict;
  const std::string json = ddp::flight::to_json(traces);
  if (!nlohmann::json::accept(json)) violated("ddp-trace --json wrote invalid JSON");
  return 0;
}
