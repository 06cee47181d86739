// Test support for ddprun's tests: run a real process with its output
// collected and a deadline, find the processes a test left behind by a tag in
// their environment, and small file and port helpers.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp::testing {

struct ProcessResult {
  int exit_code = -1;      // when the process exited
  int signal = 0;          // when a signal ended it
  bool timed_out = false;  // killed by the harness at its deadline
  std::string out, err;
};

// A child process in its own process group, stdout and stderr on pipes.
// Every wait has a bound; a process still running at the end is SIGKILLed
// with its group.
class TestProcess {
 public:
  // `env` entries "KEY=VALUE" set a variable, "-KEY" removes one; the rest
  // of the environment is the test's.
  TestProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env);
  ~TestProcess();
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `text` is in stdout or stderr, or timeout_s passes.
  bool wait_for_output(const std::string& text, double timeout_s);
  void send_signal(int sig);
  // What it wrote so far (stdout, then stderr), for failure messages.
  std::string output_so_far() const { return result_.out + result_.err; }
  // Waits for the end (SIGKILL to the group at the deadline).
  ProcessResult wait(double timeout_s);

 private:
  bool pump(int timeout_ms);  // reads available output; false once both closed

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool done_ = false;
  ProcessResult result_;
};

// Runs argv to completion (bounded by timeout_s).
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env, double timeout_s);

// A fresh "DDP_LAUNCHER_TEST_TAG=<unique>" to put in a job's environment.
std::string unique_tag();

// Live processes (zombies excluded) whose environment holds `tag`, after
// waiting up to settle_s for the list to empty.
std::vector<pid_t> processes_with_tag(const std::string& tag, double settle_s);

// SIGKILLs every process with `tag` (cleanup after a failed test).
void kill_processes_with_tag(const std::string& tag);

// A new empty directory under TMPDIR (or /tmp); remove_tree() removes one.
std::string make_temp_dir();
void remove_tree(const std::string& path);

// Waits until `path` exists (bounded).
bool wait_for_file(const std::string& path, double timeout_s);
std::string read_text(const std::string& path);

// A TCP port that is free right now.
int free_tcp_port();

// Lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

}  // namespace ddp::testing
