#include "launcher/process_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "compat/filesystem_compat.h"

extern char** environ;

namespace ddp::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> make_env(const std::vector<std::string>& changes) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const std::string& c : changes) {
    if (!c.empty() && c[0] == '-') {
      env.erase(c.substr(1));
    } else if (auto eq = c.find('='); eq != std::string::npos) {
      env[c.substr(0, eq)] = c.substr(eq + 1);
    }
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_array(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string read_environ(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/environ", std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<pid_t> tagged(const std::string& tag) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  const pid_t self = getpid();
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t pid = std::atoi(e->d_name);
    if (pid == self) continue;
    std::string env = read_environ(e->d_name);  // empty for zombies
    std::string needle = tag;
    needle.push_back('\0');
    if (env.find(needle) != std::string::npos || (env.size() >= tag.size() &&
        env.compare(env.size() - tag.size(), tag.size(), tag) == 0)) {
      out.push_back(pid);
    }
  }
  closedir(proc);
  return out;
}

}  // namespace

TestProcess::TestProcess(const std::vector<std::string>& argv_in,
                         const std::vector<std::string>& env_changes) {
  std::vector<std::string> argv = argv_in;
  std::vector<std::string> env = make_env(env_changes);
  std::vector<char*> cargv = c_array(argv);
  std::vector<char*> cenv = c_array(env);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    int null_in = open("/dev/null", O_RDONLY);
    dup2(null_in, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

TestProcess::~TestProcess() {
  if (!done_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

bool TestProcess::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  poll(fds, 2, timeout_ms);
  int* fd_of[2] = {&out_fd_, &err_fd_};
  std::string* text_of[2] = {&result_.out, &result_.err};
  for (int i = 0; i < 2; ++i) {
    if (*fd_of[i] < 0 || fds[i].revents == 0) continue;
    char buf[65536];
    ssize_t n = read(*fd_of[i], buf, sizeof(buf));
    if (n > 0) {
      text_of[i]->append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      close(*fd_of[i]);
      *fd_of[i] = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool TestProcess::wait_for_output(const std::string& text, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (result_.out.find(text) != std::string::npos ||
        result_.err.find(text) != std::string::npos) {
      return true;
    }
    if (!pump(50)) {  // both pipes closed: nothing more can come
      return result_.out.find(text) != std::string::npos ||
             result_.err.find(text) != std::string::npos;
    }
  }
  return false;
}

void TestProcess::send_signal(int sig) { kill(pid_, sig); }

ProcessResult TestProcess::wait(double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (!done_) {
    pump(50);
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
    } else if (Clock::now() > deadline) {
      result_.timed_out = true;
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      done_ = true;
    }
  }
  // Output written just before the exit (bounded: writers may linger).
  const auto drain_until = Clock::now() + std::chrono::seconds(5);
  while (pump(50) && Clock::now() < drain_until) {
  }
  if (WIFEXITED(status)) result_.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result_.signal = WTERMSIG(status);
  return result_;
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env, double timeout_s) {
  TestProcess p(argv, env);
  return p.wait(timeout_s);
}

std::string unique_tag() {
  static std::atomic<int> counter{0};
  return "DDP_LAUNCHER_TEST_TAG=" + std::to_string(getpid()) + "_" +
         std::to_string(counter++) + "_" +
         std::to_string(Clock::now().time_since_epoch().count());
}

std::vector<pid_t> processes_with_tag(const std::string& tag, double settle_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(settle_s);
  std::vector<pid_t> found = tagged(tag);
  while (!found.empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found = tagged(tag);
  }
  return found;
}

void kill_processes_with_tag(const std::string& tag) {
  for (pid_t pid : tagged(tag)) kill(pid, SIGKILL);
}

std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun_test_XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  compat::remove_tree(path, ec);
}

bool wait_for_file(const std::string& path, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  struct stat st {};
  while (stat(path.c_str(), &st) != 0) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(needle) != std::string::npos) out.push_back(line);
  }
  return out;
}

}  // namespace ddp::testing
