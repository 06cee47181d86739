#include "compat/filesystem_compat.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ddp::compat {
namespace {

struct Removal {
  std::size_t removed = 0;
  std::error_code first;
  void fail(int err) {
    if (!first) first = std::error_code(err, std::generic_category());
  }
};

void remove_at(int dir_fd, const char* name, Removal& r);

bool dot_or_dot_dot(const char* name) {
  return std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0;
}

// Removes a directory's entries, `dir` open on it. An error reading it is
// kept (the directory's own removal would only say ENOTEMPTY).
void remove_entries(DIR* dir, Removal& r) {
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(dir);
    if (e == nullptr) {
      if (errno != 0) r.fail(errno);
      return;
    }
    if (!dot_or_dot_dot(e->d_name)) remove_at(::dirfd(dir), e->d_name, r);
  }
}

// Removes what `name` names in the directory `dir_fd` (AT_FDCWD at the top):
// a directory's entries first, through file descriptors relative to it, so
// a directory renamed meanwhile is still walked inside itself (one open
// descriptor per level: a tree deeper than RLIMIT_NOFILE fails with EMFILE).
// A name gone meanwhile (another remover) is no error.
void remove_at(int dir_fd, const char* name, Removal& r) {
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) r.fail(errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) r.fail(errno);
      return;
    }
    DIR* dir = ::fdopendir(fd);  // owns fd from here
    if (dir == nullptr) {
      r.fail(errno);
      ::close(fd);
      return;
    }
    remove_entries(dir, r);
    ::closedir(dir);
  }
  if (::unlinkat(dir_fd, name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) == 0) {
    ++r.removed;
  } else if (errno != ENOENT) {
    r.fail(errno);
  }
}

}  // namespace

std::size_t remove_tree(const std::string& path, std::error_code& ec) {
  Removal r;
  remove_at(AT_FDCWD, path.c_str(), r);
  ec = r.first;
  return r.removed;
}

std::size_t remove_tree(const std::string& path) {
  std::error_code ec;
  const std::size_t n = remove_tree(path, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove all of", path, ec);
  return n;
}

}  // namespace ddp::compat
