// The flight recorder (ddp/flight_recorder.h, src/flight/): what each
// collective leaves in the ring, the ring's file in both of its modes, the
// events, and the verdict over the ranks' rings (Note [Flight verdict]).
// Real processes (a killed, stopped or out-of-step rank) are in
// process_group_processes_test.cc and tests/tools/ddp_train_faults_test.cc.
#include <ATen/ops/ones.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <set>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/flight_recorder.h"
#include "flight/flight_recorder.h"
#include "flight/flight_trace.h"
#include "flight/flight_verdict.h"
#include "process_group_impl.h"
#include "support/models.h"
#include "support/scoped_env.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

using flight::State;
// EXPECT_HAS(text, part): `part` occurs in `text` (shown when not).
#define EXPECT_HAS(text, part)                                        \
  do {                                                                \
    const std::string text_ = (text);                                 \
    EXPECT_NE(text_.find(part), std::string::npos) << "no \"" << (part) \
                                                   << "\" in:\n" << text_; \
  } while (0)

// The ring file of `group`'s rank `rank` in `dir`.
std::string ring_file(const TempDir& dir, const std::string& group, int rank) {
  return dir.file(flight::file_name(group, rank));
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(FlightRecorder, RecordsEachCollectiveWithItsSignatureStateAndOrder) {
  TempDir dir;
  ScopedEnv env("DDP_FLIGHT_RECORDER_DIR", dir.path());
  std::vector<flight::RankTrace> traces(2);
  run_ranks(2, [&](int r) {
    at::Tensor t = at::ones({4, 2});
    all_reduce(t);
    broadcast(t, 1);
    barrier();
    // Read while the group lives: the mapped file is current.
    traces[r] = flight::read_trace(default_group()->impl().flight->path());
  });
  for (int r = 0; r < 2; ++r) {
    const flight::RankTrace& t = traces[r];
    EXPECT_EQ(t.rank, r);
    EXPECT_EQ(t.world_size, 2);
    EXPECT_EQ(t.group, "default");
    EXPECT_EQ(t.backend, "gloo");
    EXPECT_EQ(t.events, 0u);
    ASSERT_EQ(t.entries.size(), 3u);
    EXPECT_EQ(t.entries[0].seq, 0u);
    EXPECT_EQ(t.entries[0].op, "all_reduce");
    EXPECT_HAS(t.entries[0].signature, "all_reduce SUM");
    EXPECT_HAS(t.entries[0].signature, "[4, 2]");
    EXPECT_EQ(t.entries[1].seq, 1u);
    EXPECT_HAS(t.entries[1].signature, "broadcast src=1");
    EXPECT_EQ(t.entries[2].signature, "barrier");
    for (const auto& e : t.entries) {
      EXPECT_EQ(e.state, State::kCompleted) << e.op;
      EXPECT_GT(e.end_us, 0);
      EXPECT_GE(e.end_us, e.start_us);
      EXPECT_EQ(e.step, -1);
      EXPECT_EQ(e.bucket, -1);
    }
  }
  // A group destroyed without an event leaves nothing behind.
  EXPECT_FALSE(exists(ring_file(dir, "default", 0)));
  EXPECT_FALSE(exists(ring_file(dir, "default", 1)));
}

TEST(FlightRecorder, GradientBucketsCarryTheirStepAndBucket) {
  TempDir dir;
  ScopedEnv env("DDP_FLIGHT_RECORDER_DIR", dir.path());
  std::vector<flight::RankTrace> traces(2);
  run_ranks(2, [&](int r) {
    torch::manual_seed(0);
    Mlp net;
    DistributedDataParallelOptions o;
    o.bucket_cap_mb = 0.0001;  // one bucket per parameter
    o.first_bucket_cap_mb = 0.0001;
    DistributedDataParallel<Mlp> model(net, o);
    for (int step = 0; step < 2; ++step) {
      model.forward(at::ones({2, 8}) * (r + 1)).sum().backward();
    }
    traces[r] = flight::read_trace(default_group()->impl().flight->path());
  });
  for (const auto& t : traces) {
    std::map<int64_t, std::set<int>> buckets_of_step;
    for (const auto& e : t.entries) {
      if (e.op.find("gradient bucket") == std::string::npos) continue;
      EXPECT_EQ(e.state, State::kCompleted);
      EXPECT_HAS(e.op, fmt::format("bucket {} of", e.bucket));
      EXPECT_HAS(e.op, fmt::format("(iteration {})", e.step));
      buckets_of_step[e.step].insert(e.bucket);
    }
    ASSERT_EQ(buckets_of_step.size(), 2u);
    EXPECT_GE(buckets_of_step[0].size(), 2u);  // several buckets, each named
    EXPECT_EQ(buckets_of_step[0], buckets_of_step[1]);
  }
}

TEST(FlightRecorder, TimeoutIsRecordedAndKeepsTheFile) {
  TempDir dir;
  ScopedEnv env("DDP_FLIGHT_RECORDER_DIR", dir.path());
  ThreadWorldOptions w;
  w.timeout = std::chrono::milliseconds(600);
  auto errors = run_ranks_collect(
      2,
      [&](int r) {
        at::Tensor t = at::ones({3});
        all_reduce(t);
        if (r == 0) all_reduce(t);  // rank 1 skips it
      },
      w);
  ASSERT_TRUE(is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  // Rank 0's ring noted the event, so its file outlives the group.
  flight::RankTrace t = flight::read_trace(ring_file(dir, "default", 0));
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.entries[0].state, State::kCompleted);
  EXPECT_EQ(t.entries[1].state, State::kTimedOut);
  EXPECT_GE(t.entries[1].end_us - t.entries[1].start_us, 500'000);
  EXPECT_GE(t.events, 1u);
  EXPECT_HAS(t.reason, "all_reduce #1 on rank 0 of 2 (gloo) timed out");
  EXPECT_GT(t.event_us, 0);
  // Rank 1 had no event: no file.
  EXPECT_FALSE(exists(ring_file(dir, "default", 1)));
}

TEST(FlightRecorder, EntriesZeroTurnsItOffAndABadValueIsNamed) {
  {
    ScopedEnv env("DDP_FLIGHT_RECORDER_ENTRIES", "0");
    run_ranks(1, [](int) { EXPECT_EQ(default_group()->impl().flight, nullptr); });
  }
  ScopedEnv env("DDP_FLIGHT_RECORDER_ENTRIES", "lots");
  auto errors = run_ranks_collect(1, [](int) {});
  ASSERT_TRUE(is_a<InvalidArgument>(errors[0])) << message_of(errors[0]);
  EXPECT_HAS(message_of(errors[0]), "environment variable DDP_FLIGHT_RECORDER_ENTRIES='lots' is not a number "
                        "of entries in [0, 1048576]");
}

TEST(FlightRecorder, AnUnwritableDirectoryIsNamed) {
  ScopedEnv env("DDP_FLIGHT_RECORDER_DIR", "/proc/no/such/dir");
  auto errors = run_ranks_collect(1, [](int) {});
  ASSERT_TRUE(is_a<InvalidArgument>(errors[0])) << message_of(errors[0]);
  EXPECT_HAS(message_of(errors[0]), "flight recorder: cannot create directory '/proc/no");
  EXPECT_HAS(message_of(errors[0]), "DDP_FLIGHT_RECORDER_ENTRIES=0");
}

flight::RecorderSetup anonymous(const TempDir& dir, uint32_t capacity) {
  flight::RecorderSetup s;
  s.dump_dir = dir.path();
  s.capacity = capacity;
  s.group = "g/x";  // not a file name: sanitized
  s.backend = "gloo";
  s.rank = 3;
  s.world_size = 4;
  return s;
}

TEST(FlightRecorder, AnInMemoryRingIsWrittenAtAnEventAndWrapsKeepingTheNewest) {
  TempDir dir;
  auto rec = flight::FlightRecorder::create(anonymous(dir, 4));
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->mapped());
  EXPECT_EQ(rec->path(), dir.file("ddp_flight_g_x_rank3.bin"));
  for (uint64_t seq = 0; seq < 10; ++seq) {
    uint64_t id = rec->started(seq, "all_reduce", std::string(300, 'x'), 7, 1);
    EXPECT_EQ(id, seq);
    if (seq < 9) rec->ended(id, State::kCompleted);
  }
  rec->ended(2, State::kFailed);  // wrapped past: ignored
  EXPECT_FALSE(exists(rec->path()));  // nothing written before an event
  ASSERT_TRUE(rec->note_event("first"));
  ASSERT_TRUE(rec->note_event("second"));
  flight::RankTrace t = flight::read_trace(rec->path());
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.written, 10u);
  EXPECT_EQ(t.events, 2u);
  EXPECT_EQ(t.reason, "first; second");
  ASSERT_EQ(t.entries.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(t.entries[k].seq, 6 + k);
    EXPECT_EQ(t.entries[k].step, 7);
    EXPECT_EQ(t.entries[k].bucket, 1);
    EXPECT_EQ(t.entries[k].signature.size(), 119u);  // cut to its field
    EXPECT_EQ(t.entries[k].signature.substr(116), "...");
  }
  EXPECT_EQ(t.entries[3].state, State::kStarted);
  rec.reset();
  EXPECT_TRUE(exists(dir.file("ddp_flight_g_x_rank3.bin")));  // an event's dump stays
}

TEST(FlightRecorder, Sigusr1WritesTheRingsAndTheProcessGoesOn) {
  TempDir dir;
  auto rec = flight::FlightRecorder::create(anonymous(dir, 8));
  rec->started(0, "barrier", "barrier", -1, -1);
  // Installed once per process (by the first process group, or here); the
  // test process handles SIGUSR1 nowhere else.
  flight::install_signal_handlers();
  struct sigaction now {};
  ::sigaction(SIGUSR1, nullptr, &now);
  ASSERT_NE(now.sa_handler, SIG_DFL);
  ASSERT_EQ(::raise(SIGUSR1), 0);
  flight::RankTrace t = flight::read_trace(rec->path());
  EXPECT_EQ(t.reason, "SIGUSR1: a dump was requested");
  ASSERT_EQ(t.entries.size(), 1u);
  EXPECT_EQ(t.entries[0].state, State::kStarted);
  // The public call does the same and names the files.
  std::vector<std::string> paths = dump_flight_recorder("checkpoint taken");
  EXPECT_NE(std::find(paths.begin(), paths.end(), rec->path()), paths.end());
  EXPECT_EQ(flight::read_trace(rec->path()).reason,
            "SIGUSR1: a dump was requested; checkpoint taken");
}

TEST(FlightRecorder, TwoLiveGroupsOfOneNameGetTwoFiles) {
  TempDir dir;
  flight::RecorderSetup s = anonymous(dir, 4);
  s.dir = dir.path();
  auto a = flight::FlightRecorder::create(s);
  auto b = flight::FlightRecorder::create(s);
  EXPECT_TRUE(a->mapped());
  EXPECT_EQ(a->path(), dir.file("ddp_flight_g_x_rank3.bin"));
  EXPECT_EQ(b->path(), dir.file("ddp_flight_g_x_rank3.1.bin"));
  a->started(0, "barrier", "barrier", -1, -1);
  b->started(0, "all_reduce", "all_reduce SUM float32[1]", -1, -1);
  EXPECT_EQ(flight::read_trace(a->path()).entries.at(0).op, "barrier");
  EXPECT_EQ(flight::read_trace(b->path()).entries.at(0).op, "all_reduce");
  b.reset();  // no event: its file goes, the other's stays
  EXPECT_FALSE(exists(dir.file("ddp_flight_g_x_rank3.1.bin")));
  EXPECT_TRUE(exists(a->path()));
}

TEST(FlightTrace, NotAFlightRecordIsNamed) {
  TempDir dir;
  const std::string path = dir.file("ddp_flight_x_rank0.bin");
  std::ofstream(path) << "hello";
  try {
    flight::read_trace(path);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(e.what(), "'" + path + "' is not a ddp flight record: 5 bytes");
  }
  std::vector<std::string> skipped;
  EXPECT_TRUE(flight::read_trace_dir(dir.path(), &skipped).empty());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_HAS(skipped[0], path);
  // A header that does not hold together (here a world of 0) is refused
  // before anything loops over its ranks.
  flight::RecorderSetup bad = anonymous(dir, 2);
  bad.group = "bad";
  bad.rank = 0;
  bad.world_size = 0;
  auto rec = flight::FlightRecorder::create(bad);
  ASSERT_TRUE(rec->note_event("x"));
  try {
    flight::read_trace(rec->path());
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(e.what(), "is not a ddp flight record: rank 0 of world size 0");
  }
}

// Synthetic rings for the verdict.
flight::TraceEntry entry(uint64_t seq, const std::string& sig, State state, int64_t step = 3,
                         int bucket = -1) {
  flight::TraceEntry e;
  e.id = e.seq = seq;
  e.op = sig.substr(0, sig.find(' '));
  e.signature = sig;
  e.state = state;
  e.step = step;
  e.bucket = bucket;
  e.start_us = 1'000'000;
  e.end_us = state == State::kStarted ? 0 : 6'000'000;
  return e;
}

flight::RankTrace rank_trace(int rank, int world, std::vector<flight::TraceEntry> entries,
                             const std::string& reason = "") {
  flight::RankTrace t;
  t.group = "default";
  t.backend = "gloo";
  t.host = "h";
  t.rank = rank;
  t.world_size = world;
  t.pid = 100 + rank;
  t.entries = std::move(entries);
  t.reason = reason;
  t.events = reason.empty() ? 0 : 1;
  return t;
}

TEST(FlightTrace, ARankThatNeverStartedTheNextCollectiveIsBehind) {
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 3,
                 {entry(4, "all_reduce SUM float32[8]", State::kCompleted),
                  entry(5, "all_reduce SUM float32[9]", State::kTimedOut, 3, 0),
                  entry(6, "all_reduce SUM float32[2]", State::kStarted, 3, 1)},
                 "all_reduce #5 timed out"),
      rank_trace(1, 3, {entry(4, "all_reduce SUM float32[8]", State::kCompleted)}),
      rank_trace(2, 3,
                 {entry(4, "all_reduce SUM float32[8]", State::kCompleted),
                  entry(5, "all_reduce SUM float32[9]", State::kStarted, 3, 0),
                  entry(6, "all_reduce SUM float32[2]", State::kStarted, 3, 1)})};
  const std::string v = flight::verdict(ranks);
  EXPECT_HAS(v, "process group 'default' (gloo, 3 ranks): rank 1 is behind: the others "
                           "issued #5 all_reduce [all_reduce SUM float32[9], step 3, bucket 0], "
                           "which it never started (rank 0 timed out in it after 5.00 s; rank 2 "
                           "was still in it");
  EXPECT_HAS(v, "rank 1 (pid 101, h): last #4 all_reduce [all_reduce SUM float32[8], "
                           "step 3]: completed after 5.000 s; no event noted");
  EXPECT_HAS(v, "rank 0 (pid 100, h): last #6");
  EXPECT_HAS(v, "event: all_reduce #5 timed out");
}

TEST(FlightTrace, OnlyTheMostBehindRankIsBlamedAndAQuietStopIsHedged) {
  // Rank 2 was killed after #20; rank 3 is in #21 and ranks 0 and 1 in #22
  // (buckets pipeline): only rank 2 is behind.
  auto at = [](uint64_t seq, State s, int64_t start) {
    flight::TraceEntry e = entry(seq, "all_reduce SUM float32[8]", s);
    e.start_us = start;
    e.end_us = s == State::kStarted ? 0 : start + 1000;
    return e;
  };
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 4, {at(21, State::kCompleted, 100), at(22, State::kStarted, 5'000'000)}),
      rank_trace(1, 4, {at(21, State::kCompleted, 100), at(22, State::kStarted, 5'000'000)}),
      rank_trace(2, 4, {at(20, State::kCompleted, 50)}),
      rank_trace(3, 4, {at(20, State::kCompleted, 50), at(21, State::kStarted, 100)})};
  std::string v = flight::verdict(ranks);
  EXPECT_HAS(v, "rank 2 is behind: the others issued #21 all_reduce");
  EXPECT_EQ(v.find("nobody is to blame"), std::string::npos) << v;  // 5 s of waiting
  // The same picture a few milliseconds long, nothing noted: hedged.
  ranks[0].entries[1].start_us = ranks[1].entries[1].start_us = 3000;
  v = flight::verdict(ranks);
  EXPECT_HAS(v, "rank 2 is behind");
  EXPECT_HAS(v, "no failure noted: if the job was stopped from outside while healthy, nobody is "
                "to blame");
}

// What the launcher knows (flight_verdict.h AttemptFacts): an interruption
// with nothing noted blames nobody; a rank that ended on its own is named
// instead of hedged about; each rank's line says how it ended.
TEST(FlightTrace, TheLaunchersFactsReplaceTheHedge) {
  auto at = [](uint64_t seq, State s, int64_t start) {
    flight::TraceEntry e = entry(seq, "all_reduce SUM float32[8]", s);
    e.start_us = start;
    e.end_us = s == State::kStarted ? 0 : start + 1000;
    return e;
  };
  // The quiet picture of the test above: rank 2 behind by a few ms.
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 3, {at(21, State::kCompleted, 100), at(22, State::kStarted, 3000)}),
      rank_trace(1, 3, {at(21, State::kCompleted, 100), at(22, State::kStarted, 3000)}),
      rank_trace(2, 3, {at(21, State::kCompleted, 100)})};
  auto stopped = [](int pid) { return flight::WorkerEnding{pid, false, true, -1, 15}; };

  flight::AttemptFacts interrupted;
  interrupted.interrupt_signal = 2;
  interrupted.endings = {stopped(100), stopped(101), {102, false, true, 130, 0}};
  std::string v = flight::verdict(ranks, interrupted);
  EXPECT_HAS(v, "interrupted by SIGINT (the launcher passed it to every worker) with no failure "
                "noted: nothing to blame. The ranks' last collectives were #21 to #22");
  EXPECT_EQ(v.find("behind"), std::string::npos) << v;
  EXPECT_HAS(v, "rank 2 (pid 102, h): last #21");
  EXPECT_HAS(v, "stopped by the launcher, ended with exit code 130");

  flight::AttemptFacts failed;
  failed.endings = {stopped(100), stopped(101), {102, true, false, 3, 0}};
  v = flight::verdict(ranks, failed);
  EXPECT_HAS(v, "rank 2 is behind: the others issued #22 all_reduce");
  EXPECT_HAS(v, "(rank 2 ended on its own with exit code 3: the summary above says more)");
  EXPECT_EQ(v.find("nobody is to blame"), std::string::npos) << v;
  EXPECT_HAS(v, "no event noted; ended on its own with exit code 3");
  EXPECT_HAS(v, "no event noted; stopped by the launcher, ended by signal 15 (SIGTERM)");
  EXPECT_EQ(v.find("without a failure of its own?"), std::string::npos) << v;

  // Every rank completed its last collective, one then exited with 3.
  ranks[0].entries.pop_back();
  ranks[1].entries.pop_back();
  v = flight::verdict(ranks, failed);
  EXPECT_HAS(v, "every rank here completed its last collective, #21 all_reduce [all_reduce SUM "
                "float32[8], step 3]: the failure was outside the collectives (rank 2 ended on "
                "its own with exit code 3");
}

TEST(FlightTrace, AMissingRankIsNamed) {
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 2, {entry(0, "barrier", State::kTimedOut)}, "barrier timed out")};
  const std::string v = flight::verdict(ranks);
  // Not judged: its ring may be on another node.
  EXPECT_HAS(v, "every rank here reached #0 barrier [barrier, step 3]; rank 0 did not complete "
                "it (rank 1 left no ring here: another node's, or removed)");
  EXPECT_HAS(v, "rank 1: no flight record here");
}

TEST(FlightTrace, TheOddRankOutIsNamedWhenCollectivesDiffer) {
  std::vector<flight::RankTrace> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(rank_trace(r, 3,
                               {entry(6, "all_reduce SUM float32[8]", State::kCompleted),
                                entry(7, r == 1 ? "broadcast src=0 float32[192]" : "barrier",
                                      State::kTimedOut)}));
  }
  const std::string v = flight::verdict(ranks);
  EXPECT_HAS(v, "collective #7 differs across ranks: a rank skipped, added or "
                           "reordered a collective. rank 1 is the odd one out");
  EXPECT_HAS(v, "rank 0 issued #7 barrier [barrier, step 3]; rank 1 issued #7 "
                           "broadcast [broadcast src=0 float32[192], step 3]");
}

TEST(FlightTrace, ARankAtALaterStepSkippedACollective) {
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 2, {entry(9, "all_reduce SUM float64[3]", State::kFailed, 4)}),
      rank_trace(1, 2, {entry(9, "all_reduce SUM float32[100]", State::kFailed, 5, 0)})};
  EXPECT_HAS(flight::verdict(ranks), "rank 1 is at a later step (5, the others 4): it skipped a "
                                     "collective the others issued, or they added one");
  // With three ranks the lone rank is named, whatever the steps.
  ranks.push_back(rank_trace(2, 3, {entry(9, "all_reduce SUM float64[3]", State::kFailed, 5)}));
  for (auto& t : ranks) t.world_size = 3;
  EXPECT_HAS(flight::verdict(ranks), "rank 1 is the odd one out");
}

TEST(FlightTrace, ARingGivenTwiceIsCountedOnceTheNewest) {
  std::vector<flight::RankTrace> ranks = {
      rank_trace(0, 2, {entry(3, "barrier", State::kCompleted)}),
      rank_trace(1, 2, {entry(3, "barrier", State::kCompleted)}),
      rank_trace(1, 2, {entry(7, "broadcast src=0 float32[2]", State::kStarted)})};
  ranks[0].path = "a/r0";
  ranks[1].path = "a/r1";
  ranks[1].created_us = 5;
  ranks[2].path = "b/r1";
  ranks[2].created_us = 2;  // an older attempt's
  const std::string v = flight::verdict(ranks);
  EXPECT_HAS(v, "every rank here completed its last collective, #3 barrier");
  EXPECT_HAS(v, "(rank 1's ring is also in b/r1: left out, older than a/r1)");
}

TEST(FlightTrace, EveryRankAtTheSameCollective) {
  std::vector<flight::RankTrace> done = {
      rank_trace(0, 2, {entry(2, "barrier", State::kCompleted)}),
      rank_trace(1, 2, {entry(2, "barrier", State::kCompleted)})};
  EXPECT_HAS(flight::verdict(done), "every rank here completed its last collective, #2 barrier "
                                    "[barrier, step 3]; no rank noted a failure");
  done[0].events = 1;
  EXPECT_HAS(flight::verdict(done), "[barrier, step 3]: the failure was outside the collectives");
  done[1].entries[0].state = State::kFailed;
  EXPECT_HAS(flight::verdict(done), "every rank here reached #2 barrier [barrier, step 3]; rank 1 "
                                    "did not complete it");
}

}  // namespace
}  // namespace ddp::testing
