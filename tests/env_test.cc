// read_launch_env() for torchrun, SLURM, Open MPI and no launcher; every
// error names its variable; local_rank_from_argv in its four spellings;
// ddp's own variables (read_ddp_env(), src/ddp_env.h).
//
// Each test starts from an environment without any launch variable or ddp
// variable (the EnvTest fixture unsets them and puts the originals back), so
// the result does not depend on how the test itself was launched.
#include "ddp/env.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "ddp_env.h"
#include "support/scoped_env.h"

namespace ddp {
namespace {

const char* const kLaunchVariables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_NNODES",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "DDP_TERMINAL",
    // ddp's own
    "DDP_RENDEZVOUS_FILE", "DDP_SHM", "DDP_DEBUG", "TORCH_DISTRIBUTED_DEBUG",
    "DDP_STALL_WARNING_S", "GLOO_SOCKET_IFNAME", "DDP_LOCAL_ADDR", "DDP_LOG_LEVEL", "DDP_LOG_RANK_PREFIX"};

class EnvTest : public ::testing::Test {
 protected:
  // Each variable unset for the test and put back at its end (whatever the
  // test set in between).
  void SetUp() override {
    for (const char* name : kLaunchVariables) cleared_.emplace_back(name, std::nullopt);
  }
  static void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
  }
  // The message of the InvalidArgument read_launch_env() throws ("" if none).
  static std::string error_of_read() {
    try {
      read_launch_env();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::list<testing::ScopedEnv> cleared_;
};

TEST_F(EnvTest, NoLauncherIsOneProcess) {
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, LaunchSource::kSingleProcess);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 0);
  EXPECT_FALSE(env.stdout_reaches_terminal);
  EXPECT_STREQ(to_string(env.source), "single-process");
}

TEST_F(EnvTest, Torchrun) {
  set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.1.2.3"},
       {"MASTER_PORT", "1234"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "3"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, LaunchSource::kTorchrun);
  EXPECT_STREQ(to_string(env.source), "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 3);
}

TEST_F(EnvTest, TorchrunWithoutLocalVariablesIsOneNode) {
  set({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST_F(EnvTest, LocalRankDefaultsToRankModuloLocalWorldSize) {
  set({{"RANK", "7"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(read_launch_env().local_rank, 3);
}

TEST_F(EnvTest, AgentStoreSpellings) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  for (const char* yes : {"True", "true", "1"}) {
    setenv("TORCHELASTIC_USE_AGENT_STORE", yes, 1);
    EXPECT_TRUE(read_launch_env().use_agent_store) << yes;
  }
  for (const char* no : {"False", "false", "0", ""}) {
    setenv("TORCHELASTIC_USE_AGENT_STORE", no, 1);
    EXPECT_FALSE(read_launch_env().use_agent_store) << no;
  }
}

// ddprun's DDP_TERMINAL: exactly "1", with any source.
TEST_F(EnvTest, TerminalIsOneOnly) {
  setenv("DDP_TERMINAL", "1", 1);
  EXPECT_TRUE(read_launch_env().stdout_reaches_terminal);
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_TRUE(read_launch_env().stdout_reaches_terminal);
  for (const char* no : {"0", "true", "True", ""}) {
    setenv("DDP_TERMINAL", no, 1);
    EXPECT_FALSE(read_launch_env().stdout_reaches_terminal) << no;
  }
}

TEST_F(EnvTest, SlurmMultiNodeTakesTheFirstNodeAsMaster) {
  set({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
       {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "node[03-05],gpu1"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, LaunchSource::kSlurm);
  EXPECT_STREQ(to_string(env.source), "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node03");
  EXPECT_EQ(env.master_port, 29500);
}

TEST_F(EnvTest, SlurmNodeListForms) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "1"}});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"node[03-05],gpu1", "node03"}, {"gpu1,node[03-05]", "gpu1"},
      {"a,b", "a"},                   {"single", "single"},
      {"n[7,9-10]", "n7"},            {"node[01-02]-ib", "node01-ib"},
      {"rack[2-3]-n[10-11]", "rack2-n10"}, {"x-[5-6]", "x-5"},
  };
  for (const auto& [list, first] : cases) {
    setenv("SLURM_JOB_NODELIST", list.c_str(), 1);
    EXPECT_EQ(read_launch_env().master_addr, first) << list;
  }
}

TEST_F(EnvTest, SlurmStepNodeListWinsAndMasterAddrWinsOverBoth) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"},
       {"SLURM_JOB_NODELIST", "job[1-4]"}, {"SLURM_STEP_NODELIST", "step[2-3]"}});
  EXPECT_EQ(read_launch_env().master_addr, "step2");
  set({{"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "4000"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.master_addr, "10.0.0.9");
  EXPECT_EQ(env.master_port, 4000);
}

TEST_F(EnvTest, SlurmSingleNodeUsesLoopback) {
  set({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
       {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "node07"}});
  EXPECT_EQ(read_launch_env().master_addr, "127.0.0.1");
}

TEST_F(EnvTest, SlurmNodeCountDecidesMultiNode) {
  // Tasks per node unknown, but SLURM_NNODES says two nodes.
  set({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "2"},
       {"SLURM_JOB_NODELIST", "node[07-08]"}});
  EXPECT_EQ(read_launch_env().master_addr, "node07");
  setenv("SLURM_NNODES", "1", 1);
  EXPECT_EQ(read_launch_env().master_addr, "127.0.0.1");
}

TEST_F(EnvTest, SlurmTasksPerNodeIsReadForThisNode) {
  // "3(x2),1": nodes 0 and 1 run 3 tasks, node 2 runs 1.
  set({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"},
       {"SLURM_TASKS_PER_NODE", "3(x2),1"}, {"SLURM_NODEID", "2"}});
  EXPECT_EQ(read_launch_env().local_world_size, 1);
  setenv("SLURM_NODEID", "1", 1);
  EXPECT_EQ(read_launch_env().local_world_size, 3);
  unsetenv("SLURM_NODEID");  // node 0 then
  EXPECT_EQ(read_launch_env().local_world_size, 3);
  setenv("SLURM_NTASKS_PER_NODE", "2", 1);  // wins when set
  EXPECT_EQ(read_launch_env().local_world_size, 2);
}

TEST_F(EnvTest, SlurmLocalRankDefaultsToProcIdModuloTasksPerNode) {
  set({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
}

TEST_F(EnvTest, OpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"MASTER_ADDR", "head"}, {"MASTER_PORT", "23456"}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, LaunchSource::kOpenMpi);
  EXPECT_STREQ(to_string(env.source), "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 23456);
}

TEST_F(EnvTest, PrecedenceTorchrunThenSlurmThenOpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "6"}});
  EXPECT_EQ(read_launch_env().source, LaunchSource::kOpenMpi);
  set({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "5"}});
  LaunchEnv slurm = read_launch_env();
  EXPECT_EQ(slurm.source, LaunchSource::kSlurm);
  EXPECT_EQ(slurm.rank, 2);
  EXPECT_EQ(slurm.world_size, 5);
  set({{"RANK", "1"}, {"WORLD_SIZE", "4"}});
  LaunchEnv torchrun = read_launch_env();
  EXPECT_EQ(torchrun.source, LaunchSource::kTorchrun);
  EXPECT_EQ(torchrun.rank, 1);
  EXPECT_EQ(torchrun.world_size, 4);
}

TEST_F(EnvTest, EmptyVariablesCountAsUnset) {
  set({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_PORT", ""}, {"MASTER_ADDR", ""}});
  LaunchEnv env = read_launch_env();
  EXPECT_EQ(env.source, LaunchSource::kSingleProcess);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

struct ErrorCase {
  std::map<std::string, std::string> vars;
  std::vector<std::string> expected;  // substrings of the message
};

TEST_F(EnvTest, EveryErrorNamesTheVariable) {
  const std::vector<ErrorCase> cases = {
      {{{"RANK", "0"}}, {"RANK", "WORLD_SIZE is missing", "set WORLD_SIZE"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "four"}}, {"WORLD_SIZE='four'", "not an integer"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2x"}}, {"WORLD_SIZE='2x'", "not an integer"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0", "out of range"}},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {"RANK=2", "out of range", "0..1"}},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, {"RANK=-1", "out of range"}},
      {{{"RANK", "one"}, {"WORLD_SIZE", "2"}}, {"RANK='one'", "not an integer"}},
      {{{"WORLD_SIZE", "4"}}, {"WORLD_SIZE=4", "RANK is missing", "set RANK"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "5"}},
       {"LOCAL_WORLD_SIZE=5", "out of range", "1..4"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}},
       {"LOCAL_RANK=2", "out of range", "0..1"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}}, {"MASTER_PORT=0", "1..65535"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "65536"}},
       {"MASTER_PORT=65536", "1..65535"}},
      {{{"MASTER_PORT", "http"}}, {"MASTER_PORT='http'", "not an integer"}},
      {{{"TORCHELASTIC_RESTART_COUNT", "x"}}, {"TORCHELASTIC_RESTART_COUNT='x'"}},
      {{{"TORCHELASTIC_RESTART_COUNT", "-2"}}, {"TORCHELASTIC_RESTART_COUNT=-2", "out of range"}},
      {{{"SLURM_PROCID", "1"}}, {"SLURM_PROCID", "SLURM_NTASKS is missing"}},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, {"SLURM_PROCID=4", "0..3"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "8"}},
       {"SLURM_NTASKS_PER_NODE=8", "1..4"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "8"}},
       {"SLURM_TASKS_PER_NODE=8", "1..4"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(y2)"}},
       {"SLURM_TASKS_PER_NODE='2(y2)'"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_NODEID", "2"}},
       {"SLURM_NODEID=2", "SLURM_TASKS_PER_NODE='2(x2)'"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "x"}},
       {"SLURM_LOCALID='x'"}},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, {"OMPI_COMM_WORLD_SIZE is missing"}},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}},
       {"OMPI_COMM_WORLD_LOCAL_RANK=3", "0..1"}},
  };
  for (const ErrorCase& c : cases) {
    TearDown();
    SetUp();
    set(c.vars);
    std::string what = error_of_read();
    std::string label;
    for (const auto& [k, v] : c.vars) label += k + "=" + v + " ";
    ASSERT_FALSE(what.empty()) << "no InvalidArgument for " << label;
    for (const std::string& s : c.expected) {
      EXPECT_NE(what.find(s), std::string::npos)
          << label << ": '" << what << "' lacks '" << s << "'";
    }
  }
}

TEST_F(EnvTest, EnvIntParsesOrNamesTheVariable) {
  EXPECT_EQ(detail::env_int("RANK"), std::nullopt);
  setenv("RANK", "42", 1);
  EXPECT_EQ(detail::env_int("RANK"), 42);
  setenv("RANK", "-7", 1);
  EXPECT_EQ(detail::env_int("RANK"), -7);
  setenv("RANK", "4.5", 1);
  try {
    detail::env_int("RANK");
    FAIL() << "no error for RANK=4.5";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='4.5'"), std::string::npos) << e.what();
  }
}

// --- ddp's own variables ----------------------------------------------------

TEST_F(EnvTest, DdpVariablesDefaults) {
  const detail::DdpEnv env = detail::read_ddp_env();
  EXPECT_EQ(env.rendezvous_file, "");
  EXPECT_TRUE(env.shared_memory);
  EXPECT_FALSE(env.debug);
  EXPECT_EQ(env.stall_warning(), std::nullopt);
  EXPECT_EQ(env.gloo_socket_ifname, "");
  EXPECT_EQ(env.log_level, "");
  EXPECT_TRUE(env.log_rank_prefix);
}

TEST_F(EnvTest, DdpVariablesAreRead) {
  set({{"DDP_RENDEZVOUS_FILE", "/run/store"}, {"DDP_STALL_WARNING_S", "2.5"},
       {"GLOO_SOCKET_IFNAME", "eth1,eth0"}, {"DDP_LOG_LEVEL", "warn"},
       {"DDP_LOG_RANK_PREFIX", "0"}, {"DDP_LOCAL_ADDR", "10.1.2.3"}});
  const detail::DdpEnv env = detail::read_ddp_env();
  EXPECT_EQ(env.rendezvous_file, "/run/store");
  EXPECT_EQ(env.stall_warning(), std::chrono::milliseconds(2500));
  EXPECT_EQ(env.gloo_socket_ifname, "eth1");
  EXPECT_EQ(env.local_addr, "10.1.2.3");
  EXPECT_EQ(env.log_level, "warn");
  EXPECT_FALSE(env.log_rank_prefix);
  for (const char* prefixed : {"1", "", "no"}) {
    setenv("DDP_LOG_RANK_PREFIX", prefixed, 1);
    EXPECT_TRUE(detail::read_ddp_env().log_rank_prefix) << prefixed;
  }
  setenv("GLOO_SOCKET_IFNAME", ",eth0", 1);
  EXPECT_EQ(detail::read_ddp_env().gloo_socket_ifname, "");
}

TEST_F(EnvTest, DdpShmAndDebugSpellings) {
  for (const char* off : {"0", "false", "False", "off", "OFF", "no"}) {
    setenv("DDP_SHM", off, 1);
    EXPECT_FALSE(detail::read_ddp_env().shared_memory) << off;
  }
  for (const char* on : {"1", "", "on", "yes"}) {
    setenv("DDP_SHM", on, 1);
    EXPECT_TRUE(detail::read_ddp_env().shared_memory) << on;
  }
  for (const char* on : {"1", "true", "True", "ON", "on"}) {
    setenv("DDP_DEBUG", on, 1);
    EXPECT_TRUE(detail::read_ddp_env().debug) << on;
  }
  for (const char* off : {"0", "", "yes"}) {
    setenv("DDP_DEBUG", off, 1);
    EXPECT_FALSE(detail::read_ddp_env().debug) << off;
  }
  setenv("TORCH_DISTRIBUTED_DEBUG", "INFO", 1);
  EXPECT_FALSE(detail::read_ddp_env().debug);
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  EXPECT_TRUE(detail::read_ddp_env().debug);
}

TEST_F(EnvTest, StallWarningMustBeAPositiveNumberOfSeconds) {
  for (const char* bad : {"0", "-1", "abc", "2s"}) {
    setenv("DDP_STALL_WARNING_S", bad, 1);
    const detail::DdpEnv env = detail::read_ddp_env();  // the read never throws
    try {
      env.stall_warning();
      ADD_FAILURE() << "no error for DDP_STALL_WARNING_S=" << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), std::string("environment variable DDP_STALL_WARNING_S='") +
                                           bad + "' is not a positive number of seconds");
    }
  }
}

// --- local_rank_from_argv --------------------------------------------------

// argv as a mutable, null-terminated array.
struct Argv {
  explicit Argv(std::vector<std::string> args) : storage(std::move(args)) {
    for (auto& s : storage) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(storage.size());
  }
  std::vector<std::string> rest() const {
    std::vector<std::string> out;
    for (int i = 0; i < argc; ++i) out.emplace_back(ptrs[i]);
    return out;
  }
  std::vector<std::string> storage;
  std::vector<char*> ptrs;
  int argc;
};

TEST(LocalRankFromArgv, FourSpellingsAreFoundAndRemoved) {
  const std::vector<std::vector<std::string>> spellings = {
      {"--local_rank=3"}, {"--local-rank=3"}, {"--local_rank", "3"}, {"--local-rank", "3"}};
  for (const auto& flag : spellings) {
    std::vector<std::string> args = {"prog", "--epochs", "2"};
    args.insert(args.end(), flag.begin(), flag.end());
    args.push_back("data");
    Argv a(args);
    EXPECT_EQ(local_rank_from_argv(a.argc, a.ptrs.data()), 3) << flag[0];
    EXPECT_EQ(a.rest(), (std::vector<std::string>{"prog", "--epochs", "2", "data"}))
        << flag[0];
    EXPECT_EQ(a.ptrs[a.argc], nullptr) << "argv[argc] must stay null";
  }
}

TEST(LocalRankFromArgv, FirstAndLastPositions) {
  Argv first({"prog", "--local-rank", "0", "x"});
  EXPECT_EQ(local_rank_from_argv(first.argc, first.ptrs.data()), 0);
  EXPECT_EQ(first.rest(), (std::vector<std::string>{"prog", "x"}));
  Argv last({"prog", "x", "--local_rank=12"});
  EXPECT_EQ(local_rank_from_argv(last.argc, last.ptrs.data()), 12);
  EXPECT_EQ(last.rest(), (std::vector<std::string>{"prog", "x"}));
  EXPECT_EQ(last.ptrs[last.argc], nullptr);
}

TEST(LocalRankFromArgv, KeepsArgvWhenAskedAndIgnoresOtherFlags) {
  Argv keep({"prog", "--local_rank", "1"});
  EXPECT_EQ(local_rank_from_argv(keep.argc, keep.ptrs.data(), /*remove=*/false), 1);
  EXPECT_EQ(keep.rest(), (std::vector<std::string>{"prog", "--local_rank", "1"}));

  Argv none({"prog", "--local_ranks=1", "--local", "local_rank=2", "--rank=3"});
  EXPECT_EQ(local_rank_from_argv(none.argc, none.ptrs.data()), std::nullopt);
  EXPECT_EQ(none.argc, 5);

  Argv program_name_only({"--local_rank=4"});  // argv[0] is never a flag
  EXPECT_EQ(local_rank_from_argv(program_name_only.argc, program_name_only.ptrs.data()),
            std::nullopt);
}

TEST(LocalRankFromArgv, BadValuesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"prog", "--local_rank"}, "--local_rank needs a value"},
      {{"prog", "--local-rank"}, "--local-rank needs a value"},
      {{"prog", "--local_rank="}, "--local_rank=''"},
      {{"prog", "--local-rank=abc"}, "--local-rank='abc'"},
      {{"prog", "--local_rank=-1"}, "--local_rank='-1'"},
      {{"prog", "--local_rank", "--epochs"}, "--local_rank='--epochs'"},
      {{"prog", "--local-rank", "1.5"}, "--local-rank='1.5'"},
  };
  for (const auto& [args, expected] : cases) {
    Argv a(args);
    try {
      local_rank_from_argv(a.argc, a.ptrs.data());
      ADD_FAILURE() << "no error for " << args.back();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << "'" << e.what() << "' lacks '" << expected << "'";
    }
    EXPECT_EQ(a.argc, static_cast<int>(args.size())) << "argv changed on error";
  }
}

}  // namespace
}  // namespace ddp
