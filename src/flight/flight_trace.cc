// Reading flight records back, and writing them as JSON: see flight_trace.h
// (the verdict over them is flight_verdict.cc).
#include "flight/flight_trace.h"

#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ddp/error.h"

namespace ddp::flight {

const char* state_name(State s) {
  switch (s) {
    case State::kEmpty: return "empty";
    case State::kStarted: return "started";
    case State::kCompleted: return "completed";
    case State::kFailed: return "failed";
    case State::kTimedOut: return "timed out";
  }
  return "unknown";
}

namespace {

std::string field(const char* p, size_t n) { return std::string(p, ::strnlen(p, n)); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(fmt::format("flight record '{}': cannot open it ({})", path,
                                      std::strerror(errno)));
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Checks the header of `bytes` and copies it into `h`.
void check_header(const std::string& path, const std::string& bytes, Header& h) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(fmt::format("'{}' is not a ddp flight record: {}", path, why));
  };
  if (bytes.size() < sizeof(Header)) throw bad(fmt::format("{} bytes, too short", bytes.size()));
  std::memcpy(static_cast<void*>(&h), bytes.data(), sizeof(Header));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) throw bad("wrong magic");
  if (h.version != kVersion || h.header_size != sizeof(Header) || h.entry_size != sizeof(Entry)) {
    throw bad(fmt::format("version {} (header {} bytes, entry {}); this ddp-trace reads version {}",
                          h.version, h.header_size, h.entry_size, kVersion));
  }
  if (h.capacity == 0 || h.capacity > kMaxCapacity || bytes.size() < ring_bytes(h.capacity)) {
    throw bad(fmt::format("capacity {} does not fit its {} bytes", h.capacity, bytes.size()));
  }
  if (h.world_size <= 0 || h.world_size > (1 << 20) || h.rank < 0 || h.rank >= h.world_size) {
    throw bad(fmt::format("rank {} of world size {}", h.rank, h.world_size));
  }
}

}  // namespace

// Note [Flight ring]'s reader: the file is read twice, and an entry is
// taken only when it is identical in both reads with an even guard, so an
// entry a live rank was writing meanwhile is left out (counted as torn).
RankTrace read_trace(const std::string& path) {
  const std::string bytes = read_bytes(path);
  // A file replaced meanwhile (another size) counts as one read only.
  return parse_trace(bytes, read_bytes(path), path);
}

RankTrace parse_trace(const std::string& bytes, const std::string& again_read,
                      const std::string& path) {
  Header h;
  check_header(path, bytes, h);
  const std::string& again = again_read.size() == bytes.size() ? again_read : bytes;
  RankTrace t;
  t.path = path;
  t.group = field(h.group, sizeof(h.group));
  t.backend = field(h.backend, sizeof(h.backend));
  t.host = field(h.host, sizeof(h.host));
  t.reason = field(h.reason, sizeof(h.reason));
  t.rank = h.rank;
  t.world_size = h.world_size;
  t.local_rank = h.local_rank;
  t.pid = h.pid;
  t.created_us = h.created_us;
  t.event_us = h.event_us;
  t.capacity = h.capacity;
  t.events = h.events.load();
  t.written = h.written.load();
  const uint64_t first = t.written > h.capacity ? t.written - h.capacity : 0;
  for (uint32_t i = 0; i < h.capacity; ++i) {
    const size_t at = sizeof(Header) + static_cast<size_t>(i) * sizeof(Entry);
    Entry e;
    std::memcpy(static_cast<void*>(&e), bytes.data() + at, sizeof(Entry));
    if (e.state == static_cast<uint32_t>(State::kEmpty)) continue;
    if ((e.guard.load() & 1) != 0 || std::memcmp(bytes.data() + at, again.data() + at, sizeof(Entry)) != 0 ||
        e.id % h.capacity != i || e.id < first ||
        e.state > static_cast<uint32_t>(State::kTimedOut)) {
      ++t.torn;
      continue;
    }
    TraceEntry te;
    te.id = e.id;
    te.seq = e.seq;
    te.state = static_cast<State>(e.state);
    te.step = e.step;
    te.bucket = e.bucket;
    te.start_us = e.start_us;
    te.end_us = e.end_us;
    te.op = field(e.op, sizeof(e.op));
    te.signature = field(e.signature, sizeof(e.signature));
    t.entries.push_back(std::move(te));
  }
  std::sort(t.entries.begin(), t.entries.end(),
            [](const TraceEntry& a, const TraceEntry& b) { return a.id < b.id; });
  return t;
}

std::vector<RankTrace> read_trace_dir(const std::string& dir, std::vector<std::string>* skipped) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw InvalidArgument(fmt::format("cannot list flight records in '{}' ({})", dir,
                                      std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* ent = ::readdir(d)) {
    std::string name = ent->d_name;
    if (name.rfind(kFilePrefix, 0) == 0 && ends_with(name, kFileSuffix)) names.push_back(name);
  }
  ::closedir(d);
  std::vector<RankTrace> out;
  for (const std::string& name : names) {
    try {
      out.push_back(read_trace(dir + "/" + name));
    } catch (const std::exception& e) {
      if (skipped != nullptr) skipped->push_back(e.what());
    }
  }
  std::sort(out.begin(), out.end(), [](const RankTrace& a, const RankTrace& b) {
    return std::tie(a.group, a.rank) < std::tie(b.group, b.rank);
  });
  return out;
}


std::string to_json(const std::vector<RankTrace>& traces) {
  nlohmann::json all = nlohmann::json::array();
  for (const RankTrace& t : traces) {
    nlohmann::json j = {{"path", t.path},         {"group", t.group},     {"backend", t.backend},
                        {"host", t.host},         {"rank", t.rank},       {"world_size", t.world_size},
                        {"local_rank", t.local_rank}, {"pid", t.pid},     {"capacity", t.capacity},
                        {"written", t.written},   {"events", t.events},   {"reason", t.reason},
                        {"created_us", t.created_us}, {"event_us", t.event_us}, {"torn", t.torn}};
    j["entries"] = nlohmann::json::array();
    for (const TraceEntry& e : t.entries) {
      j["entries"].push_back({{"id", e.id}, {"seq", e.seq}, {"state", state_name(e.state)},
                              {"op", e.op}, {"signature", e.signature}, {"step", e.step},
                              {"bucket", e.bucket}, {"start_us", e.start_us}, {"end_us", e.end_us}});
    }
    all.push_back(std::move(j));
  }
  return all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ddp::flight
