// Reading flight records and the verdict over them: see flight_trace.h.
#include "flight/flight_trace.h"

#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
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

// "12:04:05.123" (UTC).
std::string clock_time(int64_t us) {
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (us / 1000) % 1000);
}

std::string cut(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// What happened to an entry, as a clause: "timed out after 5.00 s".
std::string outcome(const TraceEntry& e) {
  const double secs = e.end_us > 0 ? (e.end_us - e.start_us) / 1e6 : 0;
  switch (e.state) {
    case State::kStarted: return fmt::format("was still in it (started at {} UTC)", clock_time(e.start_us));
    case State::kCompleted: return fmt::format("completed it in {:.3f} s", secs);
    case State::kFailed: return fmt::format("failed in it after {:.2f} s", secs);
    case State::kTimedOut: return fmt::format("timed out in it after {:.2f} s", secs);
    case State::kEmpty: break;
  }
  return "has no record of it";
}

std::string short_entry(const TraceEntry& e) {
  std::string where = e.step >= 0 ? fmt::format(", step {}", e.step) : "";
  if (e.bucket >= 0) where += fmt::format(", bucket {}", e.bucket);
  return fmt::format("#{} {} [{}{}]", e.seq, e.op, e.signature, where);
}

// One process group's rings, one per rank, each indexed by sequence number.
struct Group {
  int world = 0;
  std::map<int, const RankTrace*> ranks;  // by rank
  std::map<int, std::map<uint64_t, const TraceEntry*>> by_seq;
  std::vector<int> missing;          // ranks of the world without a ring
  std::vector<std::string> notes;    // duplicates left out

  const TraceEntry* at(int rank, uint64_t seq) const {
    const auto& m = by_seq.at(rank);
    auto it = m.find(seq);
    return it == m.end() ? nullptr : it->second;
  }
};

// A rank's ring may be given twice (two directories, a directory and one of
// its files, two attempts): the newest is kept, and the others named.
Group make_group(const std::vector<const RankTrace*>& traces) {
  Group g;
  for (const RankTrace* t : traces) {
    g.world = std::max(g.world, t->world_size);
    auto [it, fresh] = g.ranks.emplace(t->rank, t);
    if (fresh || it->second->path == t->path) continue;
    if (it->second->pid == t->pid && it->second->created_us == t->created_us) {
      g.notes.push_back(fmt::format("  (rank {}'s ring {} is a copy of {}: counted once)", t->rank,
                                    t->path, it->second->path));
      continue;
    }
    const RankTrace* older = it->second->created_us <= t->created_us ? it->second : t;
    it->second = older == t ? it->second : t;
    g.notes.push_back(fmt::format("  (rank {}'s ring is also in {}: left out, older than {})",
                                  t->rank, older->path, it->second->path));
  }
  for (const auto& [r, t] : g.ranks) {
    auto& index = g.by_seq[r];
    for (const TraceEntry& e : t->entries) index[e.seq] = &e;  // oldest first: the last wins
  }
  for (int r = 0; r < g.world; ++r) {
    if (g.ranks.count(r) == 0) g.missing.push_back(r);
  }
  return g;
}

// Who to blame for different collectives at one sequence number: a lone
// rank among three or more; else the ranks at a later step than the rest.
std::string blame(const std::map<std::string, std::vector<int>>& by_signature,
                  const std::map<int, const TraceEntry*>& entry) {
  if (entry.size() >= 3 && by_signature.size() == 2) {
    for (const auto& [sig, rs] : by_signature) {
      if (rs.size() == 1) return fmt::format(" {} is the odd one out", ranks_text(rs));
    }
  }
  int64_t min_step = INT64_MAX, max_step = INT64_MIN;
  for (const auto& [rank, e] : entry) {
    min_step = std::min(min_step, e->step);
    max_step = std::max(max_step, e->step);
  }
  if (min_step == max_step) {
    return " The records cannot tell which rank skipped or added one: each is named below";
  }
  std::vector<int> ahead;
  for (const auto& [rank, e] : entry) {
    if (e->step == max_step) ahead.push_back(rank);
  }
  return fmt::format(" {} {} at a later step ({}, the others {}): {} skipped a collective the "
                     "others issued, or they added one",
                     ranks_text(ahead), ahead.size() == 1 ? "is" : "are", max_step, min_step,
                     ahead.size() == 1 ? "it" : "they");
}

// Note [Flight verdict]
// Over the rings of one process group: (1) the first sequence number whose
// signature (operation, shapes, dtypes) differs across the ranks that
// recorded it means a rank skipped, added or reordered a collective; (2)
// otherwise ranks whose last collective is before the others' are behind,
// and the others are waiting for them; (3) otherwise every rank reached the
// same collective, and the states say where it failed. Ranks without a ring
// (another node's, a removed file) are named, never judged.
std::vector<std::string> divergence(const Group& g) {
  std::set<uint64_t> seqs;
  for (const auto& [r, index] : g.by_seq) {
    for (const auto& [seq, e] : index) seqs.insert(seq);
  }
  for (uint64_t seq : seqs) {
    std::map<std::string, std::vector<int>> by_signature;
    std::map<int, const TraceEntry*> entry;
    for (const auto& [r, t] : g.ranks) {
      if (const TraceEntry* e = g.at(r, seq)) {
        by_signature[e->signature].push_back(r);
        entry[r] = e;
      }
    }
    if (by_signature.size() < 2) continue;
    std::string issued;
    for (const auto& [rank, e] : entry) {
      issued += fmt::format("{}rank {} issued {}", issued.empty() ? "" : "; ", rank, short_entry(*e));
    }
    return {fmt::format("collective #{} differs across ranks: a rank skipped, added or reordered a "
                        "collective.{}",
                        seq, blame(by_signature, entry)),
            "  " + issued};
  }
  return {};
}

// (2) and (3) of Note [Flight verdict]; every rank of g.ranks has entries.
// The latest moment the rings of `g` speak of, and whether any noted an event.
std::pair<int64_t, bool> record_end(const Group& g) {
  int64_t end = 0;
  bool events = false;
  for (const auto& [r, t] : g.ranks) {
    events = events || t->events > 0;
    end = std::max(end, t->event_us);
    for (const TraceEntry& e : t->entries) end = std::max({end, e.start_us, e.end_us});
  }
  return {end, events};
}

std::string position(const Group& g) {
  // The most-behind ranks: the lowest last collective. Ranks between them
  // and the furthest are in flight (buckets pipeline), not blamed.
  uint64_t lowest = UINT64_MAX, top = 0;
  for (const auto& [r, t] : g.ranks) {
    lowest = std::min(lowest, t->entries.back().seq);
    top = std::max(top, t->entries.back().seq);
  }
  std::vector<int> behind, others;
  for (const auto& [r, t] : g.ranks) {
    (t->entries.back().seq == lowest ? behind : others).push_back(r);
  }
  const auto [end_us, events] = record_end(g);
  const std::string quiet = events ? "" : "; no rank noted a failure";
  if (lowest == top) {
    std::vector<int> unfinished;
    for (const auto& [r, t] : g.ranks) {
      if (t->entries.back().state != State::kCompleted) unfinished.push_back(r);
    }
    const TraceEntry& e = g.ranks.begin()->second->entries.back();
    return unfinished.empty()
               ? fmt::format("every rank here completed its last collective, {}{}", short_entry(e),
                             events ? ": the failure was outside the collectives" : quiet)
               : fmt::format("every rank here reached {}; {} did not complete it{}",
                             short_entry(e), ranks_text(unfinished), quiet);
  }
  // The first collective the others issued after the most-behind rank's last.
  const TraceEntry* e = nullptr;
  for (int r : others) {
    const auto& index = g.by_seq.at(r);
    auto next = index.upper_bound(lowest);
    if (next != index.end() && (e == nullptr || next->second->seq < e->seq)) e = next->second;
  }
  if (e == nullptr) e = &g.ranks.at(others.front())->entries.back();  // wrapped past it
  // A job stopped from outside (Ctrl-C) while healthy looks the same, the
  // ranks a few milliseconds apart: with nothing noted, the verdict says so.
  const int64_t gap_ms = (end_us - e->start_us) / 1000;
  const std::string hedge =
      !events && gap_ms < 1000
          ? fmt::format(". Only {} ms before the records end and no failure noted: if the job "
                        "was stopped from outside while healthy, nobody is to blame",
                        gap_ms)
          : "";
  std::string waited;
  for (int r : others) {
    const TraceEntry* mine = g.at(r, e->seq);
    waited += fmt::format("{}rank {} {}", waited.empty() ? "" : "; ", r,
                          mine != nullptr ? outcome(*mine) : "has no record of it");
  }
  return fmt::format("{} {} behind: the others issued {}, which {} never started ({}){}",
                     ranks_text(behind), behind.size() == 1 ? "is" : "are", short_entry(*e),
                     behind.size() == 1 ? "it" : "they", waited, hedge);
}

std::string rank_line(int r, const RankTrace& t) {
  std::string last = t.entries.empty() ? std::string("no collective")
                                       : "last " + describe_entry(t.entries.back());
  return fmt::format("  rank {} (pid {}, {}): {}; {}", r, t.pid, t.host, last,
                     t.events == 0 ? std::string("no event noted (killed, stopped or hung "
                                                 "without a failure of its own?)")
                                   : "event: " + cut(t.reason, 240));
}

std::vector<std::string> group_verdict(const std::vector<const RankTrace*>& traces) {
  const Group g = make_group(traces);
  const RankTrace& any = *g.ranks.begin()->second;
  std::vector<std::string> lines{
      fmt::format("process group '{}' ({}, {} ranks): ", any.group, any.backend, g.world)};
  Group recorded = g;  // the ranks with at least one collective
  for (auto it = recorded.ranks.begin(); it != recorded.ranks.end();) {
    it = it->second->entries.empty() ? recorded.ranks.erase(it) : std::next(it);
  }
  std::vector<std::string> body = divergence(recorded);
  if (body.empty()) {
    body.push_back(recorded.ranks.empty() ? "no rank recorded a collective" : position(recorded));
  }
  if (!g.missing.empty()) {
    body.front() += fmt::format(" ({} left no ring here: another node's, or removed)",
                                ranks_text(g.missing));
  }
  lines[0] += body.front();
  lines.insert(lines.end(), body.begin() + 1, body.end());
  for (int r = 0; r < g.world; ++r) {
    auto it = g.ranks.find(r);
    lines.push_back(it != g.ranks.end()
                        ? rank_line(r, *it->second)
                        : fmt::format("  rank {}: no flight record here (another node's, not "
                                      "started, recorder off, or its group ended without an "
                                      "event)",
                                      r));
  }
  lines.insert(lines.end(), g.notes.begin(), g.notes.end());
  return lines;
}

}  // namespace

std::string describe_entry(const TraceEntry& e) {
  std::string out = short_entry(e) + ": " + state_name(e.state);
  if (e.end_us > 0) out += fmt::format(" after {:.3f} s", (e.end_us - e.start_us) / 1e6);
  return out;
}

namespace {

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
  Header h;
  check_header(path, bytes, h);
  std::string again = read_bytes(path);
  if (again.size() != bytes.size()) again = bytes;  // replaced meanwhile: one read only
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

std::string verdict(const std::vector<RankTrace>& traces) {
  // Rings of one group name but different world sizes come from different
  // jobs: judged apart.
  std::map<std::pair<std::string, int>, std::vector<const RankTrace*>> groups;
  for (const RankTrace& t : traces) groups[{t.group, t.world_size}].push_back(&t);
  std::string out;
  for (const auto& [name, ranks] : groups) {
    for (const std::string& line : group_verdict(ranks)) out += line + "\n";
  }
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
