#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "ddp/error.h"

namespace ddp::shm {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw CommError(fmt::format("shared memory: could not {} {} in /dev/shm: {}", what, name,
                              std::strerror(err)));
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    fail("map", name, err);
  }
  ::close(fd);  // the mapping keeps the memory
  return p;
}

}  // namespace

Segment Segment::create(const std::string& name, size_t bytes, size_t reserved) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0) fail("create", name, errno);
  Segment s;
  s.name_ = name;
  s.owns_name_ = true;
  // The umask can only narrow the mode; fchmod makes 0600 explicit.
  int err = 0;
  if (::fchmod(fd, S_IRUSR | S_IWUSR) != 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    err = errno;
  } else if (reserved > 0) {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(std::min(reserved, bytes)));
  }
  if (err != 0) {
    ::close(fd);
    s.unlink();
    fail("size", name, err);
  }
  s.fd_ = ::dup(fd);  // map() closes fd
  s.data_ = map(fd, bytes, name);
  s.size_ = bytes;
  return s;
}

bool Segment::reserve(size_t offset, size_t bytes) noexcept {
  return fd_ >= 0 && ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) fail("open", name, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw CommError(fmt::format("shared memory: {} is smaller than the {} bytes agreed", name,
                                bytes));
  }
  Segment s;
  s.name_ = name;
  s.data_ = map(fd, bytes, name);
  s.size_ = bytes;
  return s;
}

Segment::Segment(Segment&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      name_(std::move(o.name_)),
      owns_name_(std::exchange(o.owns_name_, false)),
      fd_(std::exchange(o.fd_, -1)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unlink();
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    owns_name_ = std::exchange(o.owns_name_, false);
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

Segment::~Segment() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void Segment::unlink() noexcept {
  if (owns_name_) ::shm_unlink(name_.c_str());
  owns_name_ = false;
}

std::string segment_name(const std::string& token, pid_t pid, int rank) {
  return fmt::format("/ddp-{}-{}-{}", token, pid, rank);
}

int64_t dev_shm_free_bytes() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0 || ::access("/dev/shm", W_OK) != 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

void remove_stale_segments() noexcept {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const uid_t me = ::getuid();
  while (dirent* e = ::readdir(dir)) {
    const std::string file = e->d_name;
    if (file.rfind("ddp-", 0) != 0) continue;
    // ddp-<token>-<pid>-<rank>
    const size_t last = file.rfind('-');
    const size_t before = file.rfind('-', last - 1);
    if (last == std::string::npos || before == std::string::npos || before < 4) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(file.substr(before + 1, last - before - 1).c_str()));
    struct stat st {};
    if (pid <= 0 || ::stat(("/dev/shm/" + file).c_str(), &st) != 0 || st.st_uid != me) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + file).c_str());
  }
  ::closedir(dir);
}

}  // namespace ddp::shm
