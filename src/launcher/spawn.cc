#include "launcher/spawn.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "ddp/error.h"
#include "launcher/signals.h"

namespace ddp::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

std::vector<char*> c_array(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const std::string& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Pipes of one worker: [0] read end, [1] write end; all close-on-exec.
struct Pipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  int exec_error[2] = {-1, -1};
  int null_in = -1;

  void close_all() {
    for (int* p : {out, err, exec_error}) {
      for (int i = 0; i < 2; ++i) {
        if (p[i] >= 0) close(p[i]);
        p[i] = -1;
      }
    }
    if (null_in >= 0) close(null_in);
    null_in = -1;
  }
};

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const Pipes& p, pid_t parent, const char* path,
                             char* const* argv, char* const* envp) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl
  reset_signals_in_child();
  if (p.null_in >= 0) dup2(p.null_in, STDIN_FILENO);
  dup2(p.out[1], STDOUT_FILENO);
  dup2(p.err[1], STDERR_FILENO);
  execve(path, argv, envp);
  int e = errno;
  ssize_t ignored = write(p.exec_error[1], &e, sizeof(e));
  (void)ignored;
  _exit(127);
}

void open_pipes(Pipes& p, bool stdin_null) {
  if (pipe2(p.out, O_CLOEXEC) != 0 || pipe2(p.err, O_CLOEXEC) != 0 ||
      pipe2(p.exec_error, O_CLOEXEC) != 0) {
    int e = errno;
    p.close_all();
    throw Error(fmt::format("ddprun: pipe failed: {}", std::strerror(e)));
  }
  if (stdin_null) p.null_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

// Waits for exec: the error pipe closes on success, carries errno otherwise.
int exec_errno(int fd) {
  int e = 0;
  while (true) {
    ssize_t n = read(fd, &e, sizeof(e));
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof(e)) ? e : 0;
  }
}

// Why `program` (which exists) cannot be run, and what to run instead: a
// directory is named as one; a script's advice names its own interpreter
// (its #! line), python3 only for a Python file.
std::string not_executable(const std::string& program) {
  struct stat st {};
  if (::stat(program.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return fmt::format("program '{}' is a directory: give the program to run (a file in it)",
                       program);
  }
  std::string interpreter;
  std::ifstream in(program);
  std::string first;
  if (in && std::getline(in, first) && first.rfind("#!", 0) == 0) {
    interpreter = first.substr(2);
    while (!interpreter.empty() && interpreter.front() == ' ') interpreter.erase(0, 1);
    // "/usr/bin/env python3" -> "python3"
    if (interpreter.rfind("/usr/bin/env ", 0) == 0) interpreter = interpreter.substr(13);
  } else if (program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0) {
    interpreter = "python3";
  } else if (program.size() > 3 && program.compare(program.size() - 3, 3, ".sh") == 0) {
    interpreter = "bash";
  }
  if (interpreter.empty()) {
    return fmt::format("program '{}' is not an executable file: chmod +x it", program);
  }
  return fmt::format("program '{}' is not an executable file: chmod +x it, or run it with its "
                     "interpreter (ddprun [flags] {} {})",
                     program, interpreter, program);
}

}  // namespace

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (is_executable_file(program)) return program;
    if (access(program.c_str(), F_OK) != 0) {
      throw InvalidArgument(fmt::format(
          "program '{}' does not exist: check the path", program));
    }
    throw InvalidArgument(not_executable(program));
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::string::size_type start = 0;
  while (start <= path.size()) {
    auto end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  throw InvalidArgument(fmt::format(
      "program '{}' was not found in PATH: give its path (./{}) or install it",
      program, program));
}

SpawnedWorker spawn_worker(const WorkerCommand& command) {
  std::vector<char*> argv = c_array(command.argv);
  std::vector<char*> envp = c_array(command.env);
  Pipes p;
  open_pipes(p, command.stdin_null);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    p.close_all();
    throw Error(fmt::format("ddprun: fork failed: {}", std::strerror(e)));
  }
  if (pid == 0) exec_child(p, parent, command.path.c_str(), argv.data(), envp.data());
  setpgid(pid, pid);  // also here, so the group exists before we may signal it
  close(p.out[1]);
  close(p.err[1]);
  close(p.exec_error[1]);
  p.out[1] = p.err[1] = p.exec_error[1] = -1;
  if (int e = exec_errno(p.exec_error[0])) {
    waitpid(pid, nullptr, 0);
    p.close_all();
    throw InvalidArgument(fmt::format("could not run program '{}': {}",
                                      command.path, std::strerror(e)));
  }
  SpawnedWorker w;
  w.pid = pid;
  w.stdout_fd = p.out[0];
  w.stderr_fd = p.err[0];
  fcntl(w.stdout_fd, F_SETFL, O_NONBLOCK);
  fcntl(w.stderr_fd, F_SETFL, O_NONBLOCK);
  close(p.exec_error[0]);
  if (p.null_in >= 0) close(p.null_in);
  return w;
}

}  // namespace ddp::launcher
