// Process groups across real processes (process_group_worker): env://
// with torchrun's, SLURM's and Open MPI's variables, torchrun's agent store,
// two processes claiming one rank, ranks that never join, crash or stop
// taking part, and PyTorch's own torchrun launching ddp programs.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <filesystem>
#include <fstream>
#include <thread>
#include <iterator>
#include <string>
#include <vector>

#include "flight/flight_trace.h"
#include "flight/flight_verdict.h"
#include "flight/flight_recorder.h"
#include "process_group_test_util.h"
#include "support/oracle.h"

namespace ddp {
namespace {

using testing::Child;
using testing::ChildResult;
using testing::free_port;
using testing::Stopwatch;
using testing::TempDir;

const std::string kWorker = PROCESS_GROUP_WORKER_PATH;

// Every launch variable removed: children see only what a test gives them.
std::vector<std::string> clean_env(std::vector<std::string> extra) {
  std::vector<std::string> env = {
      "-RANK", "-WORLD_SIZE", "-LOCAL_RANK", "-LOCAL_WORLD_SIZE", "-MASTER_ADDR",
      "-MASTER_PORT", "-TORCHELASTIC_USE_AGENT_STORE", "-TORCHELASTIC_RESTART_COUNT",
      "-SLURM_PROCID", "-SLURM_NTASKS", "-SLURM_LOCALID", "-SLURM_NTASKS_PER_NODE",
      "-SLURM_TASKS_PER_NODE", "-SLURM_NODEID", "-SLURM_NNODES", "-SLURM_STEP_NODELIST",
      "-SLURM_JOB_NODELIST", "-OMPI_COMM_WORLD_RANK", "-OMPI_COMM_WORLD_SIZE",
      "-OMPI_COMM_WORLD_LOCAL_RANK", "-OMPI_COMM_WORLD_LOCAL_SIZE", "-GLOO_SOCKET_IFNAME",
      "OMP_NUM_THREADS=1"};
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

struct Rank {
  std::vector<std::string> args;  // process_group_worker's arguments
  std::vector<std::string> env;   // on top of clean_env()
};

// Starts every rank at once and waits for all (each bounded by timeout_s).
std::vector<ChildResult> run_ranks(const std::vector<Rank>& ranks, double timeout_s) {
  TempDir dir;
  std::vector<std::unique_ptr<Child>> children;
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::vector<std::string> argv = {kWorker};
    argv.insert(argv.end(), ranks[i].args.begin(), ranks[i].args.end());
    children.push_back(std::make_unique<Child>(argv, clean_env(ranks[i].env),
                                               dir.path() + "/out" + std::to_string(i)));
  }
  std::vector<ChildResult> results;
  for (auto& c : children) results.push_back(c->wait(timeout_s));
  return results;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void expect_sum(const std::vector<ChildResult>& results, const std::string& source, int sum) {
  const int world = static_cast<int>(results.size());
  for (int r = 0; r < world; ++r) {
    const ChildResult& c = results[r];
    EXPECT_EQ(c.exit_code, 0) << "rank " << r << ":\n" << c.output;
    EXPECT_TRUE(has(c.output, "joined rank " + std::to_string(r) + " world " +
                                  std::to_string(world) + " local_rank " + std::to_string(r) +
                                  " source " + source))
        << c.output;
    EXPECT_TRUE(has(c.output, "sum " + std::to_string(sum) + "\n")) << c.output;
  }
}

TEST(ProcessGroupProcesses, EnvWithTorchrunVariables) {
  const std::string port = std::to_string(free_port());
  std::vector<Rank> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back({{"env://", "-1", "-1", "30000", "allreduce"},
                     {"RANK=" + std::to_string(r), "WORLD_SIZE=3", "LOCAL_RANK=" + std::to_string(r),
                      "LOCAL_WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}});
  }
  expect_sum(run_ranks(ranks, 60), "torchrun", 6);
}

TEST(ProcessGroupProcesses, EnvWithSlurmVariables) {
  const std::string port = std::to_string(free_port());
  std::vector<Rank> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back({{"env://", "-1", "-1", "30000", "allreduce"},
                     {"SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=2",
                      "SLURM_LOCALID=" + std::to_string(r), "SLURM_TASKS_PER_NODE=2",
                      "SLURM_NNODES=1", "SLURM_JOB_NODELIST=node01", "MASTER_PORT=" + port}});
  }
  expect_sum(run_ranks(ranks, 60), "slurm", 3);
}

TEST(ProcessGroupProcesses, EnvWithOpenMpiVariables) {
  const std::string port = std::to_string(free_port());
  std::vector<Rank> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back({{"env://", "-1", "-1", "30000", "allreduce"},
                     {"OMPI_COMM_WORLD_RANK=" + std::to_string(r), "OMPI_COMM_WORLD_SIZE=2",
                      "OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(r),
                      "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_PORT=" + port}});
  }
  expect_sum(run_ranks(ranks, 60), "openmpi", 3);
}

// The test plays torchrun's agent: it hosts the store, and every rank is a
// client whose keys live under /worker/attempt_<restart count>.
TEST(ProcessGroupProcesses, TorchelasticAgentStore) {
  c10d::TCPStoreOptions so;
  so.port = 0;  // any free port
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(30);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const std::string port = std::to_string(store->getPort());
  for (int attempt : {0, 3}) {
    std::vector<Rank> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back({{"env://", "-1", "-1", "30000", "allreduce"},
                       {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                        "MASTER_PORT=" + port, "TORCHELASTIC_USE_AGENT_STORE=True",
                        "TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt)}});
    }
    auto results = run_ranks(ranks, 60);
    expect_sum(results, "torchrun", 3);
    EXPECT_TRUE(has(results[0].output, "agent_store 1 restart " + std::to_string(attempt)))
        << results[0].output;
    const std::string prefix = "/worker/attempt_" + std::to_string(attempt) + "/ddp/default/0/";
    EXPECT_TRUE(store->check({prefix + "rank/0"})) << prefix;
    EXPECT_TRUE(store->check({prefix + "rank/1"})) << prefix;
    EXPECT_EQ(store->add(prefix + "arrived", 0), 2) << prefix;
  }
  // Nothing outside the agent's prefix.
  EXPECT_FALSE(store->check({"ddp/default/0/rank/0"}));
  EXPECT_FALSE(store->check({"/ddp/default/0/rank/0"}));
}

std::vector<std::string> tcp_args(const std::string& url, int rank, int world,
                                  const std::string& timeout_ms, const std::string& action) {
  return {url, std::to_string(rank), std::to_string(world), timeout_ms, action};
}

TEST(ProcessGroupProcesses, TwoProcessesClaimingOneRankBothFailSayingSo) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  Stopwatch watch;
  auto results = run_ranks({{tcp_args(url, 0, 3, "30000", "allreduce")},
                            {tcp_args(url, 1, 3, "30000", "allreduce")},
                            {tcp_args(url, 1, 3, "30000", "allreduce")}},
                           60);
  EXPECT_LT(watch.seconds(), 25.0) << "must not wait for the 30 s timeout";
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].exit_code, 2) << i << ":\n" << results[i].output;
    EXPECT_TRUE(has(results[i].output, "error InvalidArgument: two processes claim rank 1 "
                                       "(world size 3) at the rendezvous 127.0.0.1:"))
        << i << ":\n" << results[i].output;
    EXPECT_TRUE(has(results[i].output, "give each process a distinct RANK in [0, 3)"))
        << results[i].output;
  }
}

// RANK=0 WORLD_SIZE=2 beside RANK=1 WORLD_SIZE=3: both fail at once, naming
// both values, instead of a Gloo socket timeout after the full timeout.
TEST(ProcessGroupProcesses, WorldSizeMismatchIsNamedOnEveryRankAtOnce) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  Stopwatch watch;
  auto results = run_ranks({{tcp_args(url, 0, 2, "30000", "allreduce")},
                            {tcp_args(url, 1, 3, "30000", "allreduce")}},
                           60);
  EXPECT_LT(watch.seconds(), 25.0) << "must not wait for the 30 s timeout";
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].exit_code, 2) << i << ":\n" << results[i].output;
    EXPECT_TRUE(has(results[i].output, "error InvalidArgument: the ranks disagree on the world "
                                       "size at the rendezvous 127.0.0.1:"))
        << i << ":\n" << results[i].output;
    EXPECT_TRUE(has(results[i].output, "WORLD_SIZE=3, but the ranks before it with WORLD_SIZE=2") ||
                has(results[i].output, "WORLD_SIZE=2, but the ranks before it with WORLD_SIZE=3"))
        << i << ":\n" << results[i].output;
  }
}

TEST(ProcessGroupProcesses, TwoProcessesClaimingRankZeroBothFailSayingSo) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  Stopwatch watch;
  auto results = run_ranks({{tcp_args(url, 0, 2, "30000", "allreduce")},
                            {tcp_args(url, 0, 2, "30000", "allreduce")}},
                           60);
  EXPECT_LT(watch.seconds(), 25.0) << "must not wait for the 30 s timeout";
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].exit_code, 2) << i << ":\n" << results[i].output;
    EXPECT_TRUE(has(results[i].output, "two processes claim rank 0 (world size 2)"))
        << i << ":\n" << results[i].output;
  }
}

TEST(ProcessGroupProcesses, RankThatNeverJoinsTimesOutNamingIt) {
  const int port = free_port();
  Stopwatch watch;
  auto results = run_ranks({{{"env://", "-1", "-1", "2000", "allreduce"},
                             {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + std::to_string(port)}}},
                           60);
  EXPECT_LT(watch.seconds(), 25.0);
  EXPECT_EQ(results[0].exit_code, 3) << results[0].output;
  EXPECT_TRUE(has(results[0].output, "error TimeoutError: rendezvous at 127.0.0.1:" +
                                         std::to_string(port) + " timed out after 2 s on rank 0: "
                                         "1 of 2 ranks arrived, 1 missing (rank 1)"))
      << results[0].output;
}

TEST(ProcessGroupProcesses, RankThatCrashesFailsTheOthersWithinTheTimeout) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  Stopwatch watch;
  std::vector<std::string> rank0 = tcp_args(url, 0, 2, "30000", "allreduce");
  rank0.insert(rank0.end(), {"gloo", "3000"});  // the all_reduce's own timeout
  auto results = run_ranks({{rank0}, {tcp_args(url, 1, 2, "30000", "exit")}}, 60);
  EXPECT_LT(watch.seconds(), 50.0);
  EXPECT_EQ(results[1].exit_code, 0) << results[1].output;
  // Gloo sees the closed connection (CommError) or waits out the timeout.
  EXPECT_TRUE(results[0].exit_code == 3 || results[0].exit_code == 4) << results[0].output;
  EXPECT_TRUE(has(results[0].output, "all_reduce #0 on rank 0 of 2 (gloo)")) << results[0].output;
}

// A fatal signal notes an event in the rank's flight record (whose mapped
// file is current anyway) and still ends the process by that signal.
TEST(ProcessGroupProcesses, FatalSignalIsNotedInTheFlightRecord) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  TempDir flight;
  const std::string dir = "DDP_FLIGHT_RECORDER_DIR=" + flight.path();
  auto results = run_ranks({{tcp_args(url, 0, 2, "3000", "segv"), {dir}},
                            {tcp_args(url, 1, 2, "3000", "segv"), {dir}}},
                           60);
  EXPECT_EQ(results[1].exit_code, -1) << results[1].output;  // ended by the signal
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  ddp::flight::RankTrace one =
      ddp::flight::read_trace(flight.path() + "/" + ddp::flight::file_name("default", 1));
  EXPECT_EQ(one.reason, "killed by signal 11 (SIGSEGV)");
  ASSERT_FALSE(one.entries.empty());
  EXPECT_EQ(one.entries.back().op, "all_reduce");
  EXPECT_EQ(one.entries.back().state, ddp::flight::State::kCompleted);
  std::vector<ddp::flight::RankTrace> both = ddp::flight::read_trace_dir(flight.path(), nullptr);
  ASSERT_EQ(both.size(), 2u);
  const std::string verdict = ddp::flight::verdict(both);
  EXPECT_TRUE(has(verdict, "rank 1 is behind: the others issued #1 barrier [barrier]")) << verdict;
  EXPECT_TRUE(has(verdict, "event: killed by signal 11 (SIGSEGV)")) << verdict;
}

TEST(ProcessGroupProcesses, RankThatStopsTakingPartTimesOutTheOthers) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  TempDir dir;
  Child sleeper({kWorker, url, "1", "2", "60000", "sleep"}, clean_env({}), dir.path() + "/sleeper");
  Stopwatch watch;
  // The group's timeout is 60 s, the all_reduce's own 2 s: the process must
  // fail and exit well before the group's timeout (Gloo's worker thread,
  // still blocked, must not hold up the exit).
  Child active({kWorker, url, "0", "2", "60000", "allreduce", "gloo", "2000"}, clean_env({}),
               dir.path() + "/active");
  ChildResult r = active.wait(90);
  EXPECT_LT(watch.seconds(), 45.0);
  EXPECT_FALSE(r.killed);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.output, "error TimeoutError: all_reduce #0 on rank 0 of 2 (gloo) timed out"))
      << r.output;
  ChildResult s = sleeper.wait(0);  // still sleeping: killed
  EXPECT_TRUE(s.killed);
  EXPECT_TRUE(has(s.output, "joined rank 1 world 2")) << s.output;
}

// A rank stopped 500 ms after a collective (its publisher thread stopped
// with it) is reported with that collective, not with the record of its
// start (Note [Progress publication]: publication follows a change within
// 100 ms, where it used to wait for the next period, here 1 s).
TEST(ProcessGroupProcesses, StoppedRankIsReportedWithItsLastCollective) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  TempDir dir;
  Child stopped({kWorker, url, "1", "2", "5000", "stop"}, clean_env({}), dir.path() + "/stopped");
  Child active({kWorker, url, "0", "2", "5000", "stop"}, clean_env({}), dir.path() + "/active");
  ChildResult r = active.wait(60);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.output, "barrier #1 on rank 0 of 2 (gloo) timed out")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1 has not reached it: at step -1, last started all_reduce #0"))
      << r.output;
  EXPECT_TRUE(has(r.output, "and finished it")) << r.output;
  EXPECT_FALSE(has(r.output, "no collective yet")) << r.output;
  ChildResult s = stopped.wait(0);  // stopped: killed
  EXPECT_TRUE(s.killed);
}

// Through init_process_group() in a real process (every message of
// read_launch_env() is checked in env_test).
TEST(ProcessGroupProcesses, BadEnvironmentIsNamed) {
  struct Case {
    std::vector<std::string> env;
    std::vector<std::string> args;
    std::string expected;
  };
  const std::string port = "MASTER_PORT=" + std::to_string(free_port());
  const std::vector<Case> cases = {
      {{"RANK=0", port}, {}, "error InvalidArgument: environment variable RANK is set (0) but WORLD_SIZE is missing"},
      {{"RANK=2", "WORLD_SIZE=2", port}, {}, "RANK=2 is out of range: expected 0..1"},
      {{"RANK=0", "WORLD_SIZE=1", port}, {"mpi"}, "unknown backend 'mpi'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"env://", "-1", "-1", "5000", "allreduce"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto results = run_ranks({{args, c.env}}, 30);
    EXPECT_EQ(results[0].exit_code, 2) << results[0].output;
    EXPECT_TRUE(has(results[0].output, c.expected)) << "expected '" << c.expected << "' in:\n"
                                                    << results[0].output;
  }
}

// PyTorch's own launcher, from the oracle's torch (2.13, or Debian's 1.13,
// whose torchrun crashes at launch unless -r/-t are given: hence "-r 2 -t 2").
bool python_torchrun_available() { return ddp::testing::oracle_configured(); }

ChildResult run_torchrun(const std::vector<std::string>& rdzv_flags,
                         const std::vector<std::string>& program, const TempDir& dir) {
  std::vector<std::string> argv = {ddp::testing::oracle_python(), "-m", "torch.distributed.run",
                                   "--nproc_per_node", "2", "-r", "2", "-t", "2",
                                   // Not a torchelastic_* directory left in TMPDIR.
                                   "--log_dir", dir.path() + "/torchrun-logs"};
  argv.insert(argv.end(), rdzv_flags.begin(), rdzv_flags.end());
  argv.push_back("--no_python");
  argv.insert(argv.end(), program.begin(), program.end());
  Child torchrun(argv, clean_env({"-PYTHONPATH"}), dir.path() + "/torchrun.out");
  return torchrun.wait(180);
}

TEST(ProcessGroupProcesses, UnderPythonTorchrunWithItsAgentStore) {
  if (!python_torchrun_available()) {
    GTEST_SKIP() << ddp::testing::kNoOracle;
  }
  TempDir dir;
  // The static rendezvous: the agent hosts the store on master_port.
  ChildResult r = run_torchrun(
      {"--master_addr", "127.0.0.1", "--master_port", std::to_string(free_port())},
      {kWorker, "env://", "-1", "-1", "60000", "allreduce"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank : {0, 1}) {
    EXPECT_TRUE(has(r.output, "joined rank " + std::to_string(rank) + " world 2 local_rank " +
                                  std::to_string(rank) + " source torchrun agent_store 1 restart 0"))
        << r.output;
  }
  EXPECT_TRUE(has(r.output, "sum 3\n")) << r.output;
}

TEST(ProcessGroupProcesses, DdpDemoUnderPythonTorchrunWithC10dRendezvous) {
  if (!python_torchrun_available()) {
    GTEST_SKIP() << ddp::testing::kNoOracle;
  }
#ifndef DDP_DEMO_PATH
  GTEST_SKIP() << "ddp-demo is not built (DDP_BUILD_TOOLS=OFF)";
#else
  TempDir dir;
  // As --standalone, on a free port: rank 0 hosts the store on MASTER_PORT.
  ChildResult r = run_torchrun({"--rdzv_backend", "c10d", "--rdzv_endpoint",
                                "127.0.0.1:" + std::to_string(free_port())},
                               {DDP_DEMO_PATH}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "ddp-demo: world_size 2, all_reduce sum 3 (correct)")) << r.output;
  EXPECT_TRUE(has(r.output, "ddp-demo: DDP step, gradients averaged over 2 ranks (correct)"))
      << r.output;
#endif
}

TEST(ProcessGroupProcesses, UncaughtErrorIsWrittenToTheLaunchersErrorFile) {
  TempDir dir;
  const std::string file = dir.path() + "/error.json";
  auto r = run_ranks({{{"env://", "-1", "-1", "30000", "uncaught"},
                       {"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                        "MASTER_PORT=" + std::to_string(free_port()),
                        "TORCHELASTIC_ERROR_FILE=" + file}}},
                     60);
  EXPECT_EQ(r[0].exit_code, -1) << "expected SIGABRT:\n" << r[0].output;
  std::ifstream in(file);
  std::string json((std::istreambuf_iterator<char>(in)), {});
  // torchrun's layout (torch.distributed.elastic's @record).
  EXPECT_TRUE(has(json, "\"message\": \"ddp::InvalidArgument: rank 0: deliberate uncaught error\""))
      << json;
  EXPECT_TRUE(has(json, "\"timestamp\": \"")) << json;
}

// Note [Kept flight records], without a launcher (the ring in memory): an
// error with no collective involved writes nothing; a collective that
// times out writes the ring under $XDG_STATE_HOME/ddp/flight, never the
// working directory, and says where.
TEST(ProcessGroupProcesses, InMemoryRingsAreWrittenOnlyForCollectivesAndTheirPathIsSaid) {
  TempDir state;
  const std::vector<std::string> env = {"-DDP_FLIGHT_RECORDER_DIR",
                                        "XDG_STATE_HOME=" + state.path()};
  std::vector<std::string> alone = {"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(free_port())};
  alone.insert(alone.end(), env.begin(), env.end());
  auto r = run_ranks({{{"env://", "-1", "-1", "30000", "uncaught"}, alone}}, 60);
  EXPECT_EQ(r[0].exit_code, -1) << "expected SIGABRT:\n" << r[0].output;
  EXPECT_FALSE(has(r[0].output, "flight record")) << r[0].output;
  EXPECT_FALSE(std::filesystem::exists(state.path() + "/ddp/flight")) << r[0].output;

  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  TempDir dir;
  Child sleeper({kWorker, url, "1", "2", "60000", "sleep"}, clean_env(env), dir.path() + "/s");
  Child active({kWorker, url, "0", "2", "60000", "allreduce", "gloo", "2000"}, clean_env(env),
               dir.path() + "/a");
  ChildResult a = active.wait(90);
  EXPECT_EQ(a.exit_code, 3) << a.output;
  const std::string said = "ddp: flight record of rank 0 (default) written to ";
  const size_t at = a.output.find(said + state.path() + "/ddp/flight/");
  ASSERT_NE(at, std::string::npos) << a.output;
  const size_t from = at + said.size();
  const std::string path = a.output.substr(from, a.output.find(' ', from) - from);
  EXPECT_TRUE(std::filesystem::exists(path)) << path << "\n" << a.output;
  EXPECT_EQ(ddp::flight::read_trace(path).rank, 0);
  sleeper.wait(0);
}

// ddprun's Note [Root cause]: rank 0 fails first but exits last (ddprun
// even stops it); rank 1 sees it go, fails and exits first. The summary
// blames rank 0 and lists rank 1 as a consequence. Over Gloo (DDP_SHM=0):
// the peer notices the closed connection (shared memory would wait for
// the still-living pid).
TEST(ProcessGroupProcesses, DdprunBlamesTheFirstFailureNotTheFirstExit) {
#ifndef DDPRUN_PATH
  GTEST_SKIP() << "ddprun is not built (DDP_BUILD_TOOLS=OFF)";
#else
  TempDir dir;
  Child run({DDPRUN_PATH, "--nproc-per-node", "2", "--master-port", std::to_string(free_port()),
             kWorker, "env://", "-1", "-1", "30000", "fail-first", "gloo", "20000"},
            clean_env({"DDP_SHM=0"}), dir.path() + "/ddprun.out");
  ChildResult r = run.wait(90);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "Root cause (first observed failure): rank 0 (local_rank 0)"))
      << r.output;
  EXPECT_TRUE(has(r.output, "rank 0: the first failure")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1 (local_rank 1): failed too (exit code 4), a consequence: it "
                            "lost its connection to a failed rank"))
      << r.output;
#endif
}

// At world 6 over Gloo, DDP's average (each rank's gradient divided by 6,
// then summed) is one ulp off the exact (W + 1) / 2: ddp-demo's check
// allows for that rounding (it said "WRONG" before).
TEST(ProcessGroupProcesses, DdpDemoAtWorldSixAllowsForRounding) {
#if !defined(DDPRUN_PATH) || !defined(DDP_DEMO_PATH)
  GTEST_SKIP() << "ddprun or ddp-demo is not built (DDP_BUILD_TOOLS=OFF)";
#else
  TempDir dir;
  Child run({DDPRUN_PATH, "--nproc-per-node", "6", "--master-port", std::to_string(free_port()),
             DDP_DEMO_PATH},
            clean_env({"DDP_SHM=0"}), dir.path() + "/ddprun.out");
  ChildResult r = run.wait(90);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "ddp-demo: world_size 6, all_reduce sum 21 (correct)")) << r.output;
  EXPECT_TRUE(has(r.output, "ddp-demo: DDP step, gradients averaged over 6 ranks (correct)"))
      << r.output;
#endif
}

TEST(ProcessGroupProcesses, UncaughtErrorShowsInPythonTorchrunsSummary) {
  if (!python_torchrun_available()) GTEST_SKIP() << ddp::testing::kNoOracle;
  TempDir dir;
  ChildResult r = run_torchrun(
      {"--master_addr", "127.0.0.1", "--master_port", std::to_string(free_port())},
      {kWorker, "env://", "-1", "-1", "30000", "uncaught"}, dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  // torchrun's summary shows the error file's py_callstack as "traceback".
  EXPECT_TRUE(has(r.output, "traceback : ddp::InvalidArgument: rank 0: deliberate uncaught error") ||
              has(r.output, "traceback : ddp::InvalidArgument: rank 1: deliberate uncaught error"))
      << r.output;
  EXPECT_TRUE(has(r.output, "error_file:")) << r.output;
}

// Ranks whose collectives differ in size. Over Gloo (DDP_SHM=0): Gloo
// terminates the rank that receives too much, from its transport thread;
// that rank says why (log and error file) and leaves it in the store for
// the others (Note [Last words]), which raise MismatchError with the same
// explanation. Over shared memory: every rank compares the operations and
// raises MismatchError itself.
TEST(ProcessGroupProcesses, RanksOutOfStepSaySoOnEveryRank) {
  for (const std::string path : {"DDP_SHM=0", "DDP_SHM=1"}) {
    TempDir dir;
    const std::string port = std::to_string(free_port());
    std::vector<Rank> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back({{"env://", "-1", "-1", "30000", "mismatch", "gloo", "20000"},
                       {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                        "MASTER_PORT=" + port, path,
                        "TORCHELASTIC_ERROR_FILE=" + dir.path() + "/error" + std::to_string(r)}});
    }
    auto results = run_ranks(ranks, 60);
    int aborted = 0;
    for (int r = 0; r < 2; ++r) {
      const std::string& out = results[r].output;
      EXPECT_TRUE(has(out, "the ranks are out of step")) << path << " rank " << r << ":\n" << out;
      EXPECT_TRUE(has(out, "ddp::join")) << out;
      EXPECT_TRUE(has(out, "DDP_DEBUG=1")) << out;
      if (results[r].exit_code == -1) {
        ++aborted;
        std::ifstream in(dir.path() + "/error" + std::to_string(r));
        std::string json((std::istreambuf_iterator<char>(in)), {});
        EXPECT_TRUE(has(json, "ddp::MismatchError: the ranks are out of step")) << json;
      } else {
        EXPECT_EQ(results[r].exit_code, 6) << path << ": MismatchError expected:\n" << out;
      }
    }
    if (path == "DDP_SHM=0") EXPECT_GE(aborted, 1);
    if (path == "DDP_SHM=1") {
      EXPECT_EQ(aborted, 0);
      EXPECT_TRUE(has(results[0].output, "rank 1 runs all_reduce SUM of 3 float32 elements (chunk "
                                         "of 3 at 0) where rank 0 (this one) runs all_reduce SUM "
                                         "of 1000"))
          << results[0].output;
    }
  }
}

// Names of this user's shared-memory segments created by `pid`.
std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> out;
  const std::string mark = "-" + std::to_string(pid) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ddp-", 0) == 0 && name.find(mark) != std::string::npos) out.push_back(name);
  }
  return out;
}

// Note [Shared memory lifetime] and the liveness check of Note
// [Shared-memory all-reduce], with real processes on one host: nothing is in
// /dev/shm once the group exists, and a rank SIGKILLed while its peers wait
// for it in an all_reduce fails them at once (not at the 60 s timeout),
// naming it.
TEST(ProcessGroupProcesses, SharedMemoryPeerKilledMidCollectiveFailsTheOthersAtOnce) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> argv = {kWorker, "env://", "-1", "-1", "60000",
                                     r == 2 ? "sleep" : "allreduce", "gloo", "60000"};
    children.push_back(std::make_unique<Child>(
        argv,
        clean_env({"RANK=" + std::to_string(r), "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1",
                   "MASTER_PORT=" + port}),
        dir.path() + "/out" + std::to_string(r)));
  }
  const auto joined = [&](int r) {
    std::ifstream in(dir.path() + "/out" + std::to_string(r));
    std::string text((std::istreambuf_iterator<char>(in)), {});
    return has(text, "joined rank");
  };
  for (int i = 0; i < 600 && !(joined(0) && joined(1) && joined(2)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(joined(0) && joined(1) && joined(2)) << "the ranks did not start";
  for (const auto& c : children) {
    EXPECT_TRUE(segments_of(c->pid()).empty()) << "segments still named in /dev/shm";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // 0 and 1 wait in all_reduce
  Stopwatch watch;
  children[2]->wait(0);  // SIGKILL
  for (int r = 0; r < 2; ++r) {
    ChildResult res = children[r]->wait(60);
    EXPECT_EQ(res.exit_code, 4) << "rank " << r << " should fail with CommError:\n" << res.output;
    EXPECT_TRUE(has(res.output, "rank 2 (pid ")) << res.output;
    EXPECT_TRUE(has(res.output, "exited while this collective was running")) << res.output;
  }
  EXPECT_LT(watch.seconds(), 15.0) << "the death of rank 2 must be seen, not waited out";
  for (const auto& c : children) EXPECT_TRUE(segments_of(c->pid()).empty());
}

}  // namespace
}  // namespace ddp
