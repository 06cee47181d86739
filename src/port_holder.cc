#include "port_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ddp::detail {
namespace {

// The socket inode listening on `port` in a /proc/net/tcp-format file, or
// "" when none. Columns: sl local rem st tx:rx tr:tm retrnsmt uid timeout
// inode; local is ADDR:PORT in hex, st 0A is LISTEN.
std::string listening_inode(const char* table, int port) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) {
      continue;
    }
    const auto colon = local.rfind(':');
    if (colon == std::string::npos || st != "0A") continue;
    if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) return inode;
  }
  return "";
}

// "pid N (comm)" of the process holding socket `inode`, or "".
std::string holder_of(const std::string& inode) {
  const std::string target = "socket:[" + inode + "]";
  DIR* proc = ::opendir("/proc");
  if (!proc) return "";
  std::string found;
  while (dirent* p = ::readdir(proc)) {
    if (p->d_name[0] < '0' || p->d_name[0] > '9') continue;
    const std::string fd_dir = std::string("/proc/") + p->d_name + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (!fds) continue;  // another user's process
    while (dirent* f = ::readdir(fds)) {
      char link[256];
      const std::string path = fd_dir + "/" + f->d_name;
      const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
      if (n <= 0 || target.compare(0, std::string::npos, link, static_cast<size_t>(n)) != 0) {
        continue;
      }
      std::string comm;
      std::getline(std::ifstream(std::string("/proc/") + p->d_name + "/comm"), comm);
      found = std::string("pid ") + p->d_name + " (" + comm + ")";
      break;
    }
    ::closedir(fds);
    if (!found.empty()) break;
  }
  ::closedir(proc);
  return found;
}

}  // namespace

std::string port_holder(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    const std::string inode = listening_inode(table, port);
    if (!inode.empty() && inode != "0") {
      std::string who = holder_of(inode);
      if (!who.empty()) return who;
    }
  }
  return "";
}

}  // namespace ddp::detail
