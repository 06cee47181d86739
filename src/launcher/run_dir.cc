#include "launcher/run_dir.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "compat/filesystem_compat.h"
#include "ddp/error.h"
#include "launcher/group_support.h"
#include "launcher/relay.h"
#include "proc_stat.h"

namespace ddp::launcher {
namespace {

constexpr const char* kOwnerFile = "ddprun.owner";
constexpr const char* kPrefix = "ddprun_";

// Best effort: a run directory that cannot be removed whole is left for
// remove_stale_run_dirs of a later run.
void remove_tree(const std::string& path) {
  std::error_code ec;
  compat::remove_tree(path, ec);
}

// The start time of `pid` in clock ticks since boot (/proc/PID/stat, field
// 22), or "" when there is no such process. With the pid it identifies a
// process even after the pid is reused.
std::string start_time(pid_t pid) { return detail::proc_stat_field(pid, 22); }

bool owner_is_gone(const std::string& dir) {
  std::ifstream in(dir + "/" + kOwnerFile);
  long pid = 0;
  std::string started;
  if (!(in >> pid >> started) || pid <= 0) return false;  // not ours to judge
  return start_time(static_cast<pid_t>(pid)) != started;
}

}  // namespace

int remove_stale_run_dirs(const std::string& base) {
  DIR* d = ::opendir(base.c_str());
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    const std::string dir = base + "/" + e->d_name;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) {
      continue;
    }
    if (owner_is_gone(dir)) {
      remove_tree(dir);
      ++removed;
    }
  }
  ::closedir(d);
  return removed;
}

RunDir::RunDir(const LaunchOptions& o) {
  keep_ = !o.log_dir.empty() || o.redirects.any() || o.tee.any();
  const char* tmp = std::getenv("TMPDIR");
  std::string base = !o.log_dir.empty() ? o.log_dir : (tmp && *tmp ? tmp : "/tmp");
  make_directories(base);
  if (o.log_dir.empty()) remove_stale_run_dirs(base);
  std::string id = o.run_id;
  for (char& c : id) {
    c = (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  }
  std::string tmpl = fmt::format("{}/{}{}_XXXXXX", base, o.log_dir.empty() ? kPrefix : "", id);
  if (!::mkdtemp(tmpl.data())) {
    throw InvalidArgument(fmt::format("could not create a directory in '{}': {}{}", base,
                                      std::strerror(errno),
                                      o.log_dir.empty() ? " (set TMPDIR)" : " (check --log-dir)"));
  }
  path_ = tmpl;
  if (keep_) {
    launcher_message(fmt::format("log files of every rank in {}", path_));
  } else {
    std::ofstream(path_ + "/" + kOwnerFile) << ::getpid() << ' ' << start_time(::getpid()) << '\n';
  }
}

RunDir::~RunDir() {
  if (!keep_) remove_tree(path_);
}

void RunDir::keep() {
  if (keep_) return;
  keep_ = true;
  ::unlink((path_ + "/" + kOwnerFile).c_str());  // remove_stale_run_dirs leaves it then
  launcher_message(fmt::format("keeping the run directory {}", path_));
}

std::string RunDir::attempt_dir(int restart_count) const {
  return fmt::format("{}/attempt_{}", path_, restart_count);
}

}  // namespace ddp::launcher
