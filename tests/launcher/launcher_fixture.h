// The fixture of ddprun's process tests: a scratch directory, a tag that
// marks every process of the test's job (to prove none survives), and
// helpers to build ddprun command lines around test_worker.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/process_harness.h"

namespace ddp::testing {

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    tag_ = unique_tag();
  }
  void TearDown() override {
    kill_processes_with_tag(tag_);
    remove_tree(dir_);
  }

  // ddprun <flags> --master-port <free> test_worker <worker_args>.
  std::vector<std::string> command(const std::vector<std::string>& flags,
                                   const std::vector<std::string>& worker_args) const {
    std::vector<std::string> argv{DDPRUN_PATH, "--master-port",
                                  std::to_string(free_tcp_port())};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(TEST_WORKER_PATH);
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    return argv;
  }

  // The job's environment changes: the tag, and no inherited settings that
  // would change what the workers are given.
  std::vector<std::string> env(std::vector<std::string> extra = {}) const {
    std::vector<std::string> e{tag_, "-OMP_NUM_THREADS", "-TORCHELASTIC_USE_AGENT_STORE"};
    for (const char* pet : {"PET_NPROC_PER_NODE", "PET_NNODES", "PET_MASTER_PORT",
                            "PET_MASTER_ADDR", "PET_NODE_RANK", "PET_MAX_RESTARTS"}) {
      e.push_back(std::string("-") + pet);
    }
    e.insert(e.end(), extra.begin(), extra.end());
    return e;
  }

  ProcessResult run(const std::vector<std::string>& argv,
                    const std::vector<std::string>& extra_env = {},
                    double timeout_s = 60) const {
    return run_process(argv, env(extra_env), timeout_s);
  }

  // No process of this test's job is left (waits up to 3 s for stragglers).
  void expect_no_survivors() const {
    std::vector<pid_t> left = processes_with_tag(tag_, 3.0);
    EXPECT_TRUE(left.empty()) << left.size() << " processes of the job survived, first pid "
                              << (left.empty() ? 0 : left[0]);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  std::string tag_;
};

}  // namespace ddp::testing
