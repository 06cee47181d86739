#include "launcher/group_support.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ddp/error.h"

namespace ddp::launcher {

std::string line_prefix(const std::string& templ, const LaunchOptions& o, int local_rank) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::pair<const char*, std::string> macros[] = {
      {"${role_name}", o.role},
      {"${local_rank}", std::to_string(local_rank)},
      {"${rank}", std::to_string(o.global_rank(local_rank))},
      {"${hostname}", host}};
  std::string out = templ;
  for (const auto& [macro, value] : macros) {
    for (size_t at = out.find(macro); at != std::string::npos;
         at = out.find(macro, at + value.size())) {
      out.replace(at, std::strlen(macro), value);
    }
  }
  return out;
}

StreamRoute stream_route(const LaunchOptions& o, int local_rank, int which,
                         bool prefix, const std::string& dir,
                         bool log_all_streams) {
  StreamRoute r;
  const bool shown = !o.local_ranks_filter || o.local_ranks_filter->count(local_rank) > 0;
  const bool redirected = (o.redirects.for_rank(local_rank) & which) != 0;
  const bool teed = (o.tee.for_rank(local_rank) & which) != 0;
  if (shown && !redirected) r.console_fd = which == kStdOut ? STDOUT_FILENO : STDERR_FILENO;
  r.terminal = r.console_fd >= 0 && ::isatty(r.console_fd) != 0;
  if (!o.log_line_prefix_template.empty()) {
    r.prefix = line_prefix(o.log_line_prefix_template, o, local_rank);
  } else if (prefix) {
    r.prefix = fmt::format("[rank{}]:", o.global_rank(local_rank));
  }
  if (log_all_streams || redirected || teed) {
    r.log_path = dir + (which == kStdOut ? "/stdout.log" : "/stderr.log");
  }
  if (which == kStdErr) r.tail_lines = 20;
  return r;
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw InvalidArgument(fmt::format("could not create directory '{}': {}", path, ec.message()));
}

std::string existing_error_file(const std::string& attempt_dir, int local_rank) {
  std::string path = fmt::format("{}/{}/error.json", attempt_dir, local_rank);
  struct stat st {};
  return (::stat(path.c_str(), &st) == 0 && st.st_size > 0) ? path : "";
}

double wall_clock_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

bool any_group_alive(const std::vector<pid_t>& groups) {
  for (pid_t g : groups) {
    if (::kill(-g, 0) == 0 || errno == EPERM) return true;
  }
  return false;
}

namespace {

std::vector<pid_t> direct_children() {
  std::vector<pid_t> out;
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return out;
  while (dirent* e = readdir(tasks)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(fmt::format("/proc/self/task/{}/children", e->d_name));
    pid_t pid;
    while (in >> pid) out.push_back(pid);
  }
  closedir(tasks);
  return out;
}

}  // namespace

void kill_stray_children() {
  std::vector<pid_t> children = direct_children();
  for (pid_t pid : children) ::kill(pid, SIGKILL);
  for (int i = 0; i < 200 && !children.empty(); ++i) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    children = direct_children();
    if (!children.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ddp::launcher
