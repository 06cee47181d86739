#include "support/process_world.h"

#include <gtest/gtest.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/process_group.h"

extern char** environ;

namespace ddp::testing {
namespace {

constexpr const char* kRankVar = "DDP_TEST_RANK_PROCESS";
constexpr const char* kWorldVar = "DDP_TEST_WORLD_SIZE";
constexpr const char* kDirVar = "DDP_TEST_RANK_DIR";

int env_number(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw std::runtime_error(std::string(name) + " is not set");
  return std::stoi(v);
}

std::string rank_dir() {
  const char* v = std::getenv(kDirVar);
  if (v == nullptr) throw std::runtime_error(std::string(kDirVar) + " is not set");
  return v;
}

std::string current_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The parent's environment, less a gtest output request, plus the rank's.
std::vector<std::string> rank_environment(int rank, int world_size, const std::string& dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("GTEST_OUTPUT=", 0) == 0 || kv.rfind("DDP_TEST_", 0) == 0) continue;
    env.push_back(kv);
  }
  env.push_back(std::string(kRankVar) + "=" + std::to_string(rank));
  env.push_back(std::string(kWorldVar) + "=" + std::to_string(world_size));
  env.push_back(std::string(kDirVar) + "=" + dir);
  return env;
}

pid_t spawn_rank(int rank, int world_size, const std::string& dir) {
  const std::string exe = "/proc/self/exe";
  const std::string filter = "--gtest_filter=" + current_test();
  const std::string log = dir + "/rank" + std::to_string(rank) + ".log";
  std::vector<std::string> env = rank_environment(rank, world_size, dir);
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(filter.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn of rank " + std::to_string(rank) + " failed");
  return pid;
}

}  // namespace

bool in_rank_process() { return std::getenv(kRankVar) != nullptr; }

void as_rank_process(const std::string& backend, const std::function<void(int rank)>& fn) {
  InitOptions o;
  o.backend = backend;
  o.init_method = "file://" + rank_dir() + "/store";
  o.rank = env_number(kRankVar);
  o.world_size = env_number(kWorldVar);
  o.timeout = std::chrono::seconds(60);
  DefaultGroupGuard guard(new_process_group(o));
  fn(o.rank);
}

void save_tensors(const std::string& name, const std::vector<at::Tensor>& tensors) {
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < tensors.size(); ++i) {
    archive.write(std::to_string(i), tensors[i].detach().cpu());
  }
  archive.save_to(rank_dir() + "/" + name + ".rank" + std::getenv(kRankVar) + ".pt");
}

RankProcesses::RankProcesses(int world_size, std::chrono::seconds timeout) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) pids.push_back(spawn_rank(r, world_size, dir_.path()));
  std::vector<int> status(world_size, -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = world_size;
  while (left > 0) {
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() >= deadline) {
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] > 0) ::waitpid(pids[r], &status[r], 0);
      }
      ADD_FAILURE() << "the ranks ran past " << timeout.count() << " s and were killed";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ok_ = true;
  for (int r = 0; r < world_size; ++r) {
    if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
    ok_ = false;
    ADD_FAILURE() << "rank " << r << " of " << world_size << " failed (wait status " << status[r]
                  << "); its output:\n"
                  << slurp(dir_.file("rank" + std::to_string(r) + ".log"));
  }
}

std::vector<at::Tensor> RankProcesses::load_tensors(int rank, const std::string& name) const {
  torch::serialize::InputArchive archive;
  archive.load_from(dir_.file(name + ".rank" + std::to_string(rank) + ".pt"));
  std::vector<at::Tensor> out;
  for (int i = 0;; ++i) {
    at::Tensor t;
    if (!archive.try_read(std::to_string(i), t)) break;
    out.push_back(t);
  }
  return out;
}

}  // namespace ddp::testing
