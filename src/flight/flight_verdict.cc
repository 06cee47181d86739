// The verdict over a process group's flight records: see flight_verdict.h.
#include "flight/flight_verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <iterator>
#include <map>
#include <set>
#include <utility>

namespace ddp::flight {
namespace {

// "12:04:05.123" (UTC).
std::string clock_time(int64_t us) {
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (us / 1000) % 1000);
}

// Seconds from `from_us` to `to_us`, in double: times come from files that
// may hold anything (a damaged ring), and int64 differences could overflow.
double seconds_between(int64_t from_us, int64_t to_us) {
  return (static_cast<double>(to_us) - static_cast<double>(from_us)) / 1e6;
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
  const double secs = e.end_us > 0 ? seconds_between(e.start_us, e.end_us) : 0;
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

// "SIGINT"; "signal 40" for one without a name here.
std::string signal_text(int sig) {
  switch (sig) {
    case 1: return "SIGHUP";
    case 2: return "SIGINT";
    case 3: return "SIGQUIT";
    case 6: return "SIGABRT";
    case 7: return "SIGBUS";
    case 8: return "SIGFPE";
    case 9: return "SIGKILL";
    case 11: return "SIGSEGV";
    case 15: return "SIGTERM";
  }
  return fmt::format("signal {}", sig);
}

const WorkerEnding* ending_of(const AttemptFacts& facts, const RankTrace& t) {
  for (const WorkerEnding& w : facts.endings) {
    if (w.pid == t.pid) return &w;
  }
  return nullptr;
}

// "with exit code 3", "by signal 9 (SIGKILL)".
std::string ending_text(const WorkerEnding& w) {
  if (w.signal == 0) return fmt::format("with exit code {}", w.exit_code);
  return fmt::format("by signal {} ({})", w.signal, signal_text(w.signal));
}

// The ranks of `g` that ended on their own (AttemptFacts), as a clause:
// "rank 1 ended on its own with exit code 3"; "" when none or nothing known.
std::string failed_clause(const Group& g, const AttemptFacts& facts) {
  std::vector<std::string> parts;
  for (const auto& [r, t] : g.ranks) {
    const WorkerEnding* w = ending_of(facts, *t);
    if (w != nullptr && w->failed) parts.push_back(fmt::format("rank {} ended on its own {}", r, ending_text(*w)));
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? "; " : "") + parts[i];
  return out;
}

// (2) and (3) of Note [Flight verdict]: who is behind, or where the
// collective every rank reached failed; every rank of g.ranks has entries.
// With the launcher's facts, an interruption with nothing noted blames no
// rank, and a rank that ended on its own is named rather than hedged about.
std::string who_is_behind(const Group& g, const AttemptFacts& facts) {
  // The most-behind ranks: the lowest last collective. Ranks between them
  // and the furthest are in flight (buckets pipeline), not blamed.
  uint64_t lowest = UINT64_MAX, top = 0;
  for (const auto& [r, t] : g.ranks) {
    lowest = std::min(lowest, t->entries.back().seq);
    top = std::max(top, t->entries.back().seq);
  }
  const auto [end_us, events] = record_end(g);
  const std::string failed = failed_clause(g, facts);
  if (facts.interrupt_signal != 0 && !events && failed.empty()) {
    return fmt::format(
        "interrupted by {} (the launcher passed it to every worker) with no failure noted: "
        "nothing to blame. {}",
        signal_text(facts.interrupt_signal),
        lowest == top ? fmt::format("Every rank's last collective was #{}", lowest)
                      : fmt::format("The ranks' last collectives were #{} to #{} (buckets "
                                    "pipeline: a few are in flight at once)",
                                    lowest, top));
  }
  const std::string before =
      facts.interrupt_signal != 0
          ? fmt::format("interrupted by {}; before it, ", signal_text(facts.interrupt_signal))
          : "";
  const std::string known = failed.empty() ? "" : fmt::format(" ({}: the summary above says more)", failed);
  std::vector<int> behind, others;
  for (const auto& [r, t] : g.ranks) {
    (t->entries.back().seq == lowest ? behind : others).push_back(r);
  }
  const std::string quiet = events ? "" : "; no rank noted a failure";
  if (lowest == top) {
    std::vector<int> unfinished;
    for (const auto& [r, t] : g.ranks) {
      if (t->entries.back().state != State::kCompleted) unfinished.push_back(r);
    }
    const TraceEntry& e = g.ranks.begin()->second->entries.back();
    return before +
           (unfinished.empty()
                ? fmt::format("every rank here completed its last collective, {}{}{}",
                              short_entry(e),
                              events || !failed.empty() ? ": the failure was outside the collectives"
                                                        : quiet,
                              known)
                : fmt::format("every rank here reached {}; {} did not complete it{}{}",
                              short_entry(e), ranks_text(unfinished), failed.empty() ? quiet : "",
                              known));
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
  // ranks a few milliseconds apart: with nothing noted and nothing known,
  // the verdict says so.
  const auto gap_ms = static_cast<int64_t>(
      std::clamp(seconds_between(e->start_us, end_us) * 1000, -1e15, 1e15));
  bool known_ending = false;  // the launcher saw one of these ranks end
  for (const auto& [r, t] : g.ranks) known_ending = known_ending || ending_of(facts, *t) != nullptr;
  const bool unknown = facts.interrupt_signal == 0 && !known_ending;
  const std::string hedge =
      unknown && !events && gap_ms < 1000
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
  return before + fmt::format("{} {} behind: the others issued {}, which {} never started ({}){}{}",
                              ranks_text(behind), behind.size() == 1 ? "is" : "are",
                              short_entry(*e), behind.size() == 1 ? "it" : "they", waited, hedge,
                              known);
}

std::string rank_line(int r, const RankTrace& t, const AttemptFacts& facts) {
  std::string last = t.entries.empty() ? std::string("no collective")
                                       : "last " + describe_entry(t.entries.back());
  const WorkerEnding* w = ending_of(facts, t);
  std::string ended;
  if (w != nullptr) {
    ended = w->failed    ? fmt::format("; ended on its own {}", ending_text(*w))
            : w->stopped ? fmt::format("; stopped by the launcher, ended {}", ending_text(*w))
                         : fmt::format("; ended {}", ending_text(*w));
  }
  const std::string none = w != nullptr ? "no event noted"
                                        : "no event noted (killed, stopped or hung without a "
                                          "failure of its own?)";
  return fmt::format("  rank {} (pid {}, {}): {}; {}{}", r, t.pid, t.host, last,
                     t.events == 0 ? none : "event: " + cut(t.reason, 240), ended);
}

std::vector<std::string> group_verdict(const std::vector<const RankTrace*>& traces,
                                       const AttemptFacts& facts) {
  const Group g = make_group(traces);
  const RankTrace& any = *g.ranks.begin()->second;
  std::vector<std::string> lines{
      fmt::format("process group '{}' ({}, {} rank{}): ", any.group, any.backend, g.world,
                  g.world == 1 ? "" : "s")};
  Group recorded = g;  // the ranks with at least one collective
  for (auto it = recorded.ranks.begin(); it != recorded.ranks.end();) {
    it = it->second->entries.empty() ? recorded.ranks.erase(it) : std::next(it);
  }
  std::vector<std::string> body = divergence(recorded);
  if (body.empty()) {
    body.push_back(recorded.ranks.empty() ? "no rank recorded a collective" : who_is_behind(recorded, facts));
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
                        ? rank_line(r, *it->second, facts)
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
  if (e.end_us > 0) out += fmt::format(" after {:.3f} s", seconds_between(e.start_us, e.end_us));
  return out;
}

bool collective_involved(const std::vector<RankTrace>& traces) {
  std::map<std::pair<std::string, int>, std::set<int64_t>> last;  // group -> last seqs (-1: none)
  for (const RankTrace& t : traces) {
    for (const TraceEntry& e : t.entries) {
      if (e.state != State::kCompleted) return true;
    }
    last[{t.group, t.world_size}].insert(t.entries.empty() ? -1 : static_cast<int64_t>(t.entries.back().seq));
  }
  for (const auto& [group, seqs] : last) {
    if (seqs.size() > 1) return true;
  }
  return false;
}

std::string verdict(const std::vector<RankTrace>& traces, const AttemptFacts& facts) {
  // Rings of one group name but different world sizes come from different
  // jobs: judged apart.
  std::map<std::pair<std::string, int>, std::vector<const RankTrace*>> groups;
  for (const RankTrace& t : traces) groups[{t.group, t.world_size}].push_back(&t);
  std::string out;
  for (const auto& [name, ranks] : groups) {
    for (const std::string& line : group_verdict(ranks, facts)) out += line + "\n";
  }
  return out;
}

}  // namespace ddp::flight
