// What each rank is given (worker_env.cc), the legacy --local_rank argument,
// and the launch errors: a busy master port (net.cc), a missing program
// (spawn.cc), bad flags (options.cc). Real processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(LauncherTest, EachRankSeesItsEnvironment) {
  const int port = free_tcp_port();
  auto r = run({DDPRUN_PATH, "--nproc_per_node=2", "--master_port", std::to_string(port),
                "--run-id", "job42", "--max-restarts", "3", "--role", "trainer",
                TEST_WORKER_PATH, "--print-env"},
               {"TORCHELASTIC_USE_AGENT_STORE=True"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]:env ";
    const std::string rk = std::to_string(rank);
    for (const std::string& kv :
         {"RANK=" + rk, "LOCAL_RANK=" + rk, std::string("WORLD_SIZE=2"),
          std::string("LOCAL_WORLD_SIZE=2"), std::string("GROUP_RANK=0"),
          std::string("GROUP_WORLD_SIZE=1"), "ROLE_RANK=" + rk,
          std::string("ROLE_WORLD_SIZE=2"), std::string("ROLE_NAME=trainer"),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
          std::string("TORCHELASTIC_RESTART_COUNT=0"), std::string("TORCHELASTIC_MAX_RESTARTS=3"),
          std::string("TORCHELASTIC_RUN_ID=job42"),
          std::string("TORCHELASTIC_USE_AGENT_STORE=<unset>"),
          std::string("OMP_NUM_THREADS=1")}) {
      EXPECT_THAT(r.out, HasSubstr(p + kv + "\n")) << kv;
    }
    auto error_file = lines_with(r.out, p + "TORCHELASTIC_ERROR_FILE=");
    ASSERT_EQ(error_file.size(), 1u);
    EXPECT_THAT(error_file[0], HasSubstr("/attempt_0/" + rk + "/error.json"));
  }
  EXPECT_EQ(lines_with(r.err, "setting OMP_NUM_THREADS=1").size(), 1u);
}

TEST_F(LauncherTest, OmpNumThreadsIsKeptWhenSet) {
  auto r = run(command({"--nproc-per-node", "2"}, {"--print-env"}), {"OMP_NUM_THREADS=4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_with(r.out, "env OMP_NUM_THREADS=4").size(), 2u);
  EXPECT_THAT(r.err, Not(HasSubstr("OMP_NUM_THREADS")));
}

TEST_F(LauncherTest, LegacyLaunchAppendsLocalRankAfterTheProgram) {
  auto r = run(command({"--nproc-per-node", "2", "--legacy-launch"}, {"--print-args", "x"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank0]:rank 0 args: --local_rank=0 --print-args x\n"));
  EXPECT_THAT(r.out, HasSubstr("[rank1]:rank 1 args: --local_rank=1 --print-args x\n"));
}

TEST_F(LauncherTest, UseEnvTurnsTheLegacyArgumentOff) {
  auto r = run(command({"--nproc-per-node", "2", "--legacy-launch", "--use_env"},
                       {"--print-args"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank1]:rank 1 args: --print-args\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("--local_rank")));
}

TEST_F(LauncherTest, BusyMasterPortIsNamedBeforeAnyWorkerStarts) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  auto r = run({DDPRUN_PATH, "--nproc-per-node", "2", "--master-port", port, TEST_WORKER_PATH,
                "--print-env"},
               {}, 30);
  close(fd);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--master-port " + port + " cannot be used on this host "
                               "(Address already in use): pid " + std::to_string(getpid()) +
                               " ("));  // the test holds it
  EXPECT_EQ(r.out, "");  // no worker ran
}

TEST_F(LauncherTest, MissingProgramIsNamed) {
  auto r = run({DDPRUN_PATH, "--nproc-per-node", "2", path("no-such-program")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("program '" + path("no-such-program") + "' does not exist"));
  auto r2 = run({DDPRUN_PATH, "no-such-program-in-path-xyz"});
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_THAT(r2.err, HasSubstr("'no-such-program-in-path-xyz' was not found in PATH"));
}

// A program that exists but cannot run: a directory is named as one; a
// script's advice names its own interpreter, python3 only for Python.
TEST_F(LauncherTest, AProgramThatCannotRunGetsAdviceThatFitsIt) {
  auto dir = run({DDPRUN_PATH, path("")});
  EXPECT_EQ(dir.exit_code, 1);
  EXPECT_THAT(dir.err, HasSubstr("is a directory: give the program to run"));
  std::ofstream(path("job.sh")) << "#!/bin/bash\necho hi\n";
  auto sh = run({DDPRUN_PATH, path("job.sh")});
  EXPECT_EQ(sh.exit_code, 1);
  EXPECT_THAT(sh.err, HasSubstr("'" + path("job.sh") + "' is not an executable file: chmod +x "
                                "it, or run it with its interpreter (ddprun [flags] /bin/bash " +
                                path("job.sh") + ")"));
  EXPECT_THAT(sh.err, Not(HasSubstr("python3")));
  std::ofstream(path("train.py")) << "print(1)\n";
  auto py = run({DDPRUN_PATH, path("train.py")});
  EXPECT_THAT(py.err, HasSubstr("(ddprun [flags] python3 " + path("train.py") + ")"));
}

TEST_F(LauncherTest, BadFlagsExitWithUsageErrors) {
  auto r = run({DDPRUN_PATH, "--nproc-per-node", "0", TEST_WORKER_PATH});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--nproc-per-node 0 is out of range"));
  auto r2 = run({DDPRUN_PATH, "--no-such-flag", TEST_WORKER_PATH});
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_THAT(r2.err, HasSubstr("--no-such-flag"));
  auto r3 = run({DDPRUN_PATH, "--nproc-per-node", "2"});
  EXPECT_EQ(r3.exit_code, 2);
  EXPECT_THAT(r3.err, HasSubstr("no program given"));
}

TEST_F(LauncherTest, PetVariablesGiveDefaults) {
  auto r = run({DDPRUN_PATH, "--master-port", std::to_string(free_tcp_port()),
                TEST_WORKER_PATH, "--print-env"},
               {"PET_NPROC_PER_NODE=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_with(r.out, "env LOCAL_WORLD_SIZE=3").size(), 3u);
}

}  // namespace
}  // namespace ddp::testing
