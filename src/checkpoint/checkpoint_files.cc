#include "checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "ddp/error.h"

namespace ddp {
namespace detail {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& what, const std::string& path,
                       int err) {
  throw InvalidArgument("checkpoint: cannot " + what + " '" + path +
                        "': " + std::strerror(err) +
                        " (check the directory's permissions and free space)");
}

// Parses a decimal number of at least one digit at s[pos...], advancing pos.
bool parse_number(const std::string& s, size_t& pos, int64_t& out) {
  size_t start = pos;
  out = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    if (out > (INT64_MAX - 9) / 10) return false;
    out = out * 10 + (s[pos++] - '0');
  }
  return pos > start;
}

bool parse_name(const std::string& name, ListedCheckpoint& out) {
  const std::string prefix = kCheckpointPrefix, suffix = kCheckpointSuffix;
  if (name.size() <= prefix.size() + suffix.size() ||
      name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  size_t pos = prefix.size();
  if (!parse_number(name, pos, out.epoch)) return false;
  if (name.compare(pos, 5, "-step") != 0) return false;
  pos += 5;
  if (!parse_number(name, pos, out.step)) return false;
  if (pos != name.size() - suffix.size()) return false;
  out.stem = name.substr(0, pos);
  return true;
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory; the rename itself is done.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) fail("fsync directory", dir, err);
}

void write_fd(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, std::min<size_t>(size, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", path, errno);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

std::string checkpoint_stem(int64_t epoch, int64_t step) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%06lld-step%012lld", kCheckpointPrefix,
                static_cast<long long>(epoch), static_cast<long long>(step));
  return buf;
}

std::vector<ListedCheckpoint> list_checkpoints(const std::string& dir) {
  std::vector<ListedCheckpoint> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    fail("list directory", dir, ec.value());
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    ListedCheckpoint c;
    if (parse_name(it->path().filename().string(), c)) out.push_back(c);
  }
  if (ec) fail("list directory", dir, ec.value());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.epoch, a.step) < std::tie(b.epoch, b.step);
  });
  return out;
}

void ensure_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("create directory", dir, ec.value());
}

void write_file_atomically(const std::string& dir, const std::string& name,
                           const char* data, size_t size) {
  const std::string path = dir + "/" + name;
  const std::string tmp =
      dir + "/." + name + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", tmp, errno);
  try {
    write_fd(fd, data, size, tmp);
    if (::fsync(fd) != 0) fail("fsync", tmp, errno);
    if (::close(fd) != 0) {
      fd = -1;
      fail("close", tmp, errno);
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename to " + path, tmp, errno);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(dir);
}

std::string read_whole_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open", path, errno);
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(st.st_size);
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      fail("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  const std::string prefix = std::string(".") + kCheckpointPrefix;
  const std::string model_suffix = kModelSuffix;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    const bool temporary = name.compare(0, prefix.size(), prefix) == 0 &&
                           name.find(".tmp.") != std::string::npos;
    // A model file whose checkpoint is missing: the writer died between
    // the two renames (write_checkpoint writes the model file first).
    const bool orphan =
        name.compare(0, prefix.size() - 1, prefix, 1) == 0 &&
        name.size() > model_suffix.size() &&
        name.compare(name.size() - model_suffix.size(), model_suffix.size(), model_suffix) == 0 &&
        !fs::exists(dir + "/" + name.substr(0, name.size() - model_suffix.size()) +
                    kCheckpointSuffix);
    if (temporary || orphan) {
      std::error_code rm;
      fs::remove(it->path(), rm);  // best effort: a leftover is harmless
    }
  }
}

void prune_checkpoints(const std::string& dir, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<ListedCheckpoint> all = list_checkpoints(dir);
  if (all.size() <= static_cast<size_t>(keep_last)) return;
  for (size_t i = 0; i + keep_last < all.size(); ++i) {
    // The checkpoint first: a listed checkpoint keeps its model file.
    for (const char* suffix : {kCheckpointSuffix, kModelSuffix}) {
      const std::string path = dir + "/" + all[i].stem + suffix;
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail("remove", path, errno);
    }
  }
  fsync_directory(dir);
}

}  // namespace detail
}  // namespace ddp
