// What workers are given (worker_env.cc), in process.
#include "launcher/worker_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;

TEST(LauncherWorkerEnv, RanksOfASecondNode) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.nnodes = 3;
  o.node_rank = 1;
  o.max_restarts = 4;
  o.run_id = "r";
  AttemptInfo a{2, "10.0.0.1", 1234};
  const char* base[] = {"PATH=/bin", "OMP_NUM_THREADS=", "TORCHELASTIC_USE_AGENT_STORE=True",
                        "PYTHONUNBUFFERED=0", nullptr};
  auto env = worker_environment(o, 1, a, "/e.json", base);
  for (const char* kv : {"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=6", "LOCAL_WORLD_SIZE=2",
                         "GROUP_RANK=1", "GROUP_WORLD_SIZE=3", "ROLE_RANK=3",
                         "ROLE_WORLD_SIZE=6", "ROLE_NAME=default", "MASTER_ADDR=10.0.0.1",
                         "MASTER_PORT=1234", "TORCHELASTIC_RESTART_COUNT=2",
                         "TORCHELASTIC_MAX_RESTARTS=4", "TORCHELASTIC_RUN_ID=r",
                         "TORCHELASTIC_ERROR_FILE=/e.json", "OMP_NUM_THREADS=1",
                         "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "PYTHONUNBUFFERED=0", "PATH=/bin"}) {
    EXPECT_THAT(env, Contains(kv));
  }
  EXPECT_THAT(env, Not(Contains("TORCHELASTIC_USE_AGENT_STORE=True")));
  EXPECT_TRUE(sets_omp_num_threads(o, base));  // empty counts as unset
  // A user's old-style setting stands alone (c10d reads both names).
  const char* old_name[] = {"NCCL_ASYNC_ERROR_HANDLING=0", nullptr};
  auto kept = worker_environment(o, 1, a, "/e.json", old_name);
  EXPECT_THAT(kept, Contains("NCCL_ASYNC_ERROR_HANDLING=0"));
  for (const std::string& kv : kept) EXPECT_NE(kv.rfind("TORCH_NCCL_ASYNC_ERROR_HANDLING=", 0), 0u);
}

TEST(LauncherWorkerEnv, VirtualLocalRankGivesEachWorkerItsDeviceAsZero) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.virtual_local_rank = true;
  AttemptInfo a{0, "127.0.0.1", 29500};
  const char* none[] = {nullptr};
  auto env = worker_environment(o, 1, a, "/e", none);
  EXPECT_THAT(env, Contains("LOCAL_RANK=0"));
  EXPECT_THAT(env, Contains("RANK=1"));
  EXPECT_THAT(env, Contains("CUDA_VISIBLE_DEVICES=1"));
  const char* listed[] = {"CUDA_VISIBLE_DEVICES=4,6", nullptr};
  EXPECT_THAT(worker_environment(o, 1, a, "/e", listed), Contains("CUDA_VISIBLE_DEVICES=6"));
  o.virtual_local_rank = false;
  EXPECT_THAT(worker_environment(o, 1, a, "/e", listed), Contains("LOCAL_RANK=1"));
  EXPECT_THAT(worker_environment(o, 1, a, "/e", listed), Contains("CUDA_VISIBLE_DEVICES=4,6"));
}

TEST(LauncherWorkerEnv, OneWorkerKeepsOmpUnset) {
  LaunchOptions o;
  const char* base[] = {nullptr};
  auto env = worker_environment(o, 0, AttemptInfo{0, "127.0.0.1", 29500}, "/e", base);
  for (const std::string& kv : env) EXPECT_NE(kv.rfind("OMP_NUM_THREADS=", 0), 0u);
  EXPECT_FALSE(sets_omp_num_threads(o, base));
}

// Lines ddprun prefixes with the rank: ddp's logging leaves its own prefix
// out (DDP_LOG_RANK_PREFIX=0), unless the user set the variable, even to "".
TEST(LauncherWorkerEnv, RankPrefixIsOffWhenTheLauncherPrefixesUnlessTheUserSetIt) {
  LaunchOptions o;
  AttemptInfo a{0, "127.0.0.1", 29500};
  const char* none[] = {nullptr};
  auto has_prefix_variable = [](const std::vector<std::string>& env) {
    for (const std::string& kv : env) {
      if (kv.rfind("DDP_LOG_RANK_PREFIX=", 0) == 0) return true;
    }
    return false;
  };
  EXPECT_FALSE(has_prefix_variable(worker_environment(o, 0, a, "/e", none)));
  WorkerConsole prefixed;
  prefixed.launcher_prefixes_lines = true;
  EXPECT_THAT(worker_environment(o, 0, a, "/e", none, prefixed),
              Contains("DDP_LOG_RANK_PREFIX=0"));
  const char* own[] = {"DDP_LOG_RANK_PREFIX=1", nullptr};
  auto env = worker_environment(o, 0, a, "/e", own, prefixed);
  EXPECT_THAT(env, Contains("DDP_LOG_RANK_PREFIX=1"));
  EXPECT_THAT(env, Not(Contains("DDP_LOG_RANK_PREFIX=0")));
  const char* empty[] = {"DDP_LOG_RANK_PREFIX=", nullptr};
  env = worker_environment(o, 0, a, "/e", empty, prefixed);
  EXPECT_THAT(env, Contains("DDP_LOG_RANK_PREFIX="));
  EXPECT_THAT(env, Not(Contains("DDP_LOG_RANK_PREFIX=0")));
}

// DDP_TERMINAL=1 only for a worker whose stdout the relay passes on to a
// terminal; never inherited (from an outer ddprun).
TEST(LauncherWorkerEnv, TerminalIsSetForARelayedTerminalOnlyAndNeverInherited) {
  LaunchOptions o;
  AttemptInfo a{0, "127.0.0.1", 29500};
  const char* inherited[] = {"DDP_TERMINAL=1", nullptr};
  for (const std::string& kv : worker_environment(o, 0, a, "/e", inherited)) {
    EXPECT_NE(kv.rfind("DDP_TERMINAL=", 0), 0u) << kv;
  }
  WorkerConsole relayed;
  relayed.stdout_reaches_terminal = true;
  const char* none[] = {nullptr};
  EXPECT_THAT(worker_environment(o, 0, a, "/e", none, relayed), Contains("DDP_TERMINAL=1"));
}

// --standalone's rendezvous file; an inherited one (an outer launcher's)
// is removed.
TEST(LauncherWorkerEnv, LocalAddrReachesTheWorkersOnlyWhenGiven) {
  LaunchOptions o;
  AttemptInfo a{0, "127.0.0.1", 29500};
  const char* base[] = {"PATH=/bin", nullptr};
  for (const std::string& kv : worker_environment(o, 0, a, "/e", base)) {
    EXPECT_NE(kv.rfind("DDP_LOCAL_ADDR=", 0), 0u) << kv;
  }
  o.local_addr = "10.0.0.7";
  EXPECT_THAT(worker_environment(o, 0, a, "/e", base), Contains("DDP_LOCAL_ADDR=10.0.0.7"));
}

TEST(LauncherWorkerEnv, RendezvousFileIsTheAttemptsOnly) {
  LaunchOptions o;
  const char* inherited[] = {"DDP_RENDEZVOUS_FILE=/outer.store", nullptr};
  AttemptInfo a{0, "127.0.0.1", 29500};
  for (const std::string& kv : worker_environment(o, 0, a, "/e", inherited)) {
    EXPECT_NE(kv.rfind("DDP_RENDEZVOUS_FILE=", 0), 0u) << kv;
  }
  a.store_file = "/run/store";
  auto env = worker_environment(o, 0, a, "/e", inherited);
  EXPECT_THAT(env, Contains("DDP_RENDEZVOUS_FILE=/run/store"));
  EXPECT_THAT(env, Not(Contains("DDP_RENDEZVOUS_FILE=/outer.store")));
}

TEST(LauncherWorkerEnv, FlightRecorderDirIsTheAttemptsUnlessTheUserSetOne) {
  LaunchOptions o;
  AttemptInfo a{0, "127.0.0.1", 29500};
  a.flight_dir = "/run/attempt_0/flight";
  const char* none[] = {nullptr};
  EXPECT_THAT(worker_environment(o, 0, a, "/e", none),
              Contains("DDP_FLIGHT_RECORDER_DIR=/run/attempt_0/flight"));
  const char* own[] = {"DDP_FLIGHT_RECORDER_DIR=/mine", nullptr};
  auto env = worker_environment(o, 0, a, "/e", own);
  EXPECT_THAT(env, Contains("DDP_FLIGHT_RECORDER_DIR=/mine"));
  EXPECT_THAT(env, Not(Contains("DDP_FLIGHT_RECORDER_DIR=/run/attempt_0/flight")));
}

TEST(LauncherWorkerEnv, LegacyArgumentGoesRightAfterTheProgram) {
  LaunchOptions o;
  o.program = {"train", "--lr", "0.1"};
  EXPECT_THAT(worker_arguments(o, 1), ElementsAre("train", "--lr", "0.1"));
  o.legacy_local_rank_arg = true;
  EXPECT_THAT(worker_arguments(o, 1), ElementsAre("train", "--local_rank=1", "--lr", "0.1"));
}

}  // namespace
}  // namespace ddp::launcher
