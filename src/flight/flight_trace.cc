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

const TraceEntry* find_seq(const RankTrace& t, uint64_t seq) {
  for (auto it = t.entries.rbegin(); it != t.entries.rend(); ++it) {
    if (it->seq == seq) return &*it;
  }
  return nullptr;
}

std::string short_entry(const TraceEntry& e) {
  std::string where = e.step >= 0 ? fmt::format(", step {}", e.step) : "";
  if (e.bucket >= 0) where += fmt::format(", bucket {}", e.bucket);
  return fmt::format("#{} {} [{}{}]", e.seq, e.op, e.signature, where);
}

// Note [Flight verdict]
// Over the rings of one process group: (1) the first sequence number whose
// signature (operation, shapes, dtypes) differs across the ranks that
// recorded it means a rank skipped, added or reordered a collective; (2)
// otherwise ranks whose last collective is before the others' are behind,
// and the others are waiting for them; (3) otherwise every rank reached the
// same collective, and the states say where it failed.
std::vector<std::string> divergence(const std::vector<const RankTrace*>& ranks) {
  std::set<uint64_t> seqs;
  for (const RankTrace* t : ranks) {
    for (const TraceEntry& e : t->entries) seqs.insert(e.seq);
  }
  for (uint64_t seq : seqs) {
    std::map<std::string, std::vector<int>> by_signature;
    std::map<int, const TraceEntry*> entry;
    for (const RankTrace* t : ranks) {
      if (const TraceEntry* e = find_seq(*t, seq)) {
        by_signature[e->signature].push_back(t->rank);
        entry[t->rank] = e;
      }
    }
    if (by_signature.size() < 2) continue;
    std::vector<std::string> lines;
    std::string issued;
    for (const auto& [rank, e] : entry) {
      issued += fmt::format("{}rank {} issued {}", issued.empty() ? "" : "; ", rank, short_entry(*e));
    }
    // Blame: the ranks at a later step than the rest moved on past a
    // collective; else a lone minority of three or more ranks.
    int64_t min_step = INT64_MAX, max_step = INT64_MIN;
    for (const auto& [rank, e] : entry) {
      min_step = std::min(min_step, e->step);
      max_step = std::max(max_step, e->step);
    }
    std::string blame;
    if (min_step != max_step) {
      std::vector<int> ahead;
      for (const auto& [rank, e] : entry) {
        if (e->step == max_step) ahead.push_back(rank);
      }
      blame = fmt::format(" {} {} ahead (step {}, the others step {}): {} skipped a collective the "
                          "others issued",
                          ranks_text(ahead), ahead.size() == 1 ? "is" : "are", max_step, min_step,
                          ahead.size() == 1 ? "it" : "they");
    } else if (entry.size() >= 3) {
      for (const auto& [sig, rs] : by_signature) {
        if (rs.size() == 1 && by_signature.size() == 2) {
          blame = fmt::format(" {} is the odd one out", ranks_text(rs));
        }
      }
    }
    lines.push_back(fmt::format("collective #{} differs across ranks: a rank skipped, added or "
                                "reordered a collective.{}",
                                seq, blame));
    lines.push_back("  " + issued);
    return lines;
  }
  return {};
}

std::vector<std::string> group_verdict(const std::vector<const RankTrace*>& ranks) {
  const RankTrace& any = *ranks.front();
  int world = 0;
  for (const RankTrace* t : ranks) world = std::max(world, t->world_size);
  std::vector<std::string> lines{fmt::format("process group '{}' ({}, {} ranks): ", any.group,
                                             any.backend, world)};
  std::map<int, const RankTrace*> by_rank;
  for (const RankTrace* t : ranks) by_rank[t->rank] = t;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (by_rank.count(r) == 0) missing.push_back(r);
  }
  std::vector<std::string> body = divergence(ranks);
  if (body.empty()) {
    // Last collective of each rank (by history, not by number).
    uint64_t top = 0;
    bool any_entry = false;
    for (const RankTrace* t : ranks) {
      if (!t->entries.empty()) top = std::max(top, t->entries.back().seq), any_entry = true;
    }
    std::vector<int> leaders, behind = missing;
    for (const auto& [r, t] : by_rank) {
      (any_entry && !t->entries.empty() && t->entries.back().seq == top ? leaders : behind)
          .push_back(r);
    }
    std::sort(behind.begin(), behind.end());
    if (!any_entry) {
      body.push_back("no rank recorded a collective");
    } else if (!behind.empty()) {
      // The collective the most-behind rank never started: the first the
      // others issued after its last one.
      uint64_t last = top;
      for (int r : behind) {
        if (by_rank.count(r) != 0 && !by_rank[r]->entries.empty()) {
          last = std::min(last, by_rank[r]->entries.back().seq);
        }
      }
      const TraceEntry* e = nullptr;
      for (const TraceEntry& x : by_rank[leaders.front()]->entries) {
        if (x.seq > last && (e == nullptr || x.seq < e->seq)) e = &x;
      }
      if (e == nullptr) e = &by_rank[leaders.front()]->entries.back();
      std::string waited;
      for (int r : leaders) {
        const TraceEntry* mine = find_seq(*by_rank[r], e->seq);
        waited += fmt::format("{}rank {} {}", waited.empty() ? "" : "; ", r,
                              mine != nullptr ? outcome(*mine) : "has no record of it");
      }
      body.push_back(fmt::format("{} {} behind: the others issued {}, which {} never started ({})",
                                 ranks_text(behind), behind.size() == 1 ? "is" : "are",
                                 short_entry(*e), behind.size() == 1 ? "it" : "they", waited));
    } else {
      std::vector<int> unfinished;
      for (const auto& [r, t] : by_rank) {
        if (t->entries.back().state != State::kCompleted) unfinished.push_back(r);
      }
      const TraceEntry& e = by_rank.begin()->second->entries.back();
      body.push_back(unfinished.empty()
                         ? fmt::format("every rank completed its last collective, {}: the failure "
                                       "was outside the collectives",
                                       short_entry(e))
                         : fmt::format("every rank reached {}; {} did not complete it",
                                       short_entry(e), ranks_text(unfinished)));
    }
  }
  lines[0] += body.front();
  lines.insert(lines.end(), body.begin() + 1, body.end());
  for (int r = 0; r < world; ++r) {
    auto it = by_rank.find(r);
    if (it == by_rank.end()) {
      lines.push_back(fmt::format("  rank {}: no flight record (not started, recorder off, or its "
                                  "file is elsewhere)",
                                  r));
      continue;
    }
    const RankTrace& t = *it->second;
    std::string last = t.entries.empty() ? std::string("no collective")
                                         : "last " + describe_entry(t.entries.back());
    lines.push_back(fmt::format("  rank {} (pid {}, {}): {}; {}", r, t.pid, t.host, last,
                                t.events == 0 ? std::string("no event noted (killed, stopped or "
                                                            "hung without a failure of its own?)")
                                              : "event: " + cut(t.reason, 240)));
  }
  return lines;
}

}  // namespace

std::string describe_entry(const TraceEntry& e) {
  std::string out = short_entry(e) + ": " + state_name(e.state);
  if (e.end_us > 0) out += fmt::format(" after {:.3f} s", (e.end_us - e.start_us) / 1e6);
  return out;
}

RankTrace read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(fmt::format("flight record '{}': cannot open it ({})", path,
                                      std::strerror(errno)));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) {
    return InvalidArgument(fmt::format("'{}' is not a ddp flight record: {}", path, why));
  };
  if (bytes.size() < sizeof(Header)) throw bad(fmt::format("{} bytes, too short", bytes.size()));
  Header h;
  std::memcpy(static_cast<void*>(&h), bytes.data(), sizeof(Header));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) throw bad("wrong magic");
  if (h.version != kVersion || h.header_size != sizeof(Header) || h.entry_size != sizeof(Entry)) {
    throw bad(fmt::format("version {} (header {} bytes, entry {}); this ddp-trace reads version {}",
                          h.version, h.header_size, h.entry_size, kVersion));
  }
  if (h.capacity == 0 || h.capacity > kMaxCapacity || bytes.size() < ring_bytes(h.capacity)) {
    throw bad(fmt::format("capacity {} does not fit its {} bytes", h.capacity, bytes.size()));
  }
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
    Entry e;
    std::memcpy(static_cast<void*>(&e), bytes.data() + sizeof(Header) + i * sizeof(Entry),
                sizeof(Entry));
    if (e.state == static_cast<uint32_t>(State::kEmpty)) continue;
    if ((e.guard.load() & 1) != 0 || e.id % h.capacity != i || e.id < first ||
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
  std::map<std::string, std::vector<const RankTrace*>> groups;
  for (const RankTrace& t : traces) groups[t.group].push_back(&t);
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
