// Helpers of process_group_test: ports, a busy port, a stopwatch, and child
// processes with a bounded wait (the temporary directory: support/temp_dir.h).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.h"

extern char** environ;

namespace ddp::testing {

// A socket bound to an ephemeral TCP port on every interface and listening:
// the port stays taken while the object lives.
class ListeningSocket {
 public:
  ListeningSocket() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("ListeningSocket: no ephemeral port");
    }
    port_ = ntohs(a.sin_port);
  }
  ~ListeningSocket() { close(fd_); }
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A TCP port that was free a moment ago (the kernel's next ephemeral one).
inline int free_port() { return ListeningSocket().port(); }

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

struct ChildResult {
  int exit_code = -1;  // -1 when a signal ended it
  bool killed = false;  // still running at the deadline: SIGKILLed
  std::string output;   // stdout and stderr together
};

// A child process with `env` ("KEY=VALUE" sets, "-KEY" removes) applied to
// this process's environment, its stdout and stderr in a file.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
        const std::string& output_path)
      : output_path_(output_path) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      vars[kv.substr(0, kv.find('='))] = kv;
    }
    for (const std::string& kv : env) {
      if (!kv.empty() && kv[0] == '-') {
        vars.erase(kv.substr(1));
      } else {
        vars[kv.substr(0, kv.find('='))] = kv;
      }
    }
    std::vector<std::string> env_strings;
    for (auto& [k, kv] : vars) env_strings.push_back(kv);
    std::vector<char*> envp, args;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, output_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // own group: killable whole
    int rc = posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + " failed");
  }
  ~Child() {
    if (!reaped_) wait(0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Waits up to timeout_s, then SIGKILLs the child's process group.
  ChildResult wait(double timeout_s) {
    ChildResult r;
    if (reaped_) return result_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    while (true) {
      pid_t got = waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(-pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        r.killed = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(-pid_, SIGKILL);  // whatever it left behind in its group
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    std::ifstream in(output_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    r.output = ss.str();
    reaped_ = true;
    result_ = r;
    return r;
  }

 private:
  std::string output_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  ChildResult result_;
};

}  // namespace ddp::testing
