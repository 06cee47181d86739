// The flight recorder's writer: see flight_recorder.h and Note [Flight ring].
#include "flight/flight_recorder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "ddp/error.h"
#include "ddp/flight_recorder.h"
#include "flight/flight_home.h"

namespace ddp::flight {
namespace {

int64_t now_us() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// Copies `s` into the NUL-terminated field `dst` of `n` bytes, cutting it
// with "..." when it does not fit.
void copy_cut(char* dst, size_t n, std::string_view s) noexcept {
  if (s.size() < n) {
    std::memcpy(dst, s.data(), s.size());
    dst[s.size()] = '\0';
    return;
  }
  std::memcpy(dst, s.data(), n - 4);
  std::memcpy(dst + n - 4, "...", 4);
}

// Appends "; " (when not first) and `s` to the NUL-terminated `dst` of `n`
// bytes, as far as room lasts. Async-signal-safe.
void append(char* dst, size_t n, const char* s) noexcept {
  size_t len = ::strnlen(dst, n - 1);
  auto put = [&](const char* p) {
    while (*p != '\0' && len + 1 < n) dst[len++] = *p++;
  };
  if (len > 0) put("; ");
  put(s);
  dst[len] = '\0';
}

// write(2) of all `n` bytes. Async-signal-safe.
bool write_all(int fd, const char* p, size_t n) noexcept {
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// "<records_home()>/<UTC yyyymmdd-HHMMSS>_pid<P>": one directory per
// process (its first group's time; every group of it writes there), so
// that two runs never replace each other's rings.
std::string default_dump_dir() {
  static const std::string dir = [] {
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&now, &tm);
    char when[32];
    std::strftime(when, sizeof(when), "%Y%m%d-%H%M%S", &tm);
    return fmt::format("{}/{}_pid{}", records_home(), when, ::getpid());
  }();
  return dir;
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw InvalidArgument(fmt::format(
        "flight recorder: cannot create directory '{}' ({}): set DDP_FLIGHT_RECORDER_DIR to a "
        "writable directory, or DDP_FLIGHT_RECORDER_ENTRIES=0 to turn the recorder off",
        dir, ec.message()));
  }
}

// The live recorders, for signal handlers: lock-free slots. g_busy counts
// the walks over them in progress; a recorder leaves its slot, then waits
// for the walks to end before it unmaps its ring.
constexpr int kSlots = 256;
std::atomic<FlightRecorder*> g_slots[kSlots];
std::atomic<int> g_busy{0};

// Dumps of in-memory rings so far: each writes its own temporary file.
std::atomic<uint64_t> g_dumps{0};

// "<prefix><n>" into `out` (room for any uint64). Async-signal-safe.
void numbered(char* out, size_t n, const std::string& prefix, uint64_t k) noexcept {
  char digits[24];
  int d = 0;
  do {
    digits[d++] = static_cast<char>('0' + k % 10);
    k /= 10;
  } while (k > 0);
  size_t len = 0;
  for (char c : prefix) {
    if (len + 1 < n) out[len++] = c;
  }
  while (d > 0 && len + 1 < n) out[len++] = digits[--d];
  out[len] = '\0';
}

// A name no live ring of this process has: two groups of one process may
// share a group name (another init method, or a re-created group whose
// predecessor still lives).
std::string unused_path(const std::string& dir, const std::string& name) {
  const std::vector<std::string> live = live_paths();
  std::string path = dir + "/" + name;
  for (int n = 1; std::find(live.begin(), live.end(), path) != live.end(); ++n) {
    path = fmt::format("{}/{}.{}{}", dir, name.substr(0, name.size() - std::strlen(kFileSuffix)), n,
                       kFileSuffix);
  }
  return path;
}

void enlist(FlightRecorder* r) {
  for (auto& slot : g_slots) {
    FlightRecorder* expected = nullptr;
    if (slot.compare_exchange_strong(expected, r)) return;
  }
  // More than kSlots live groups: this one records, but only its own
  // collectives' events reach it.
}

void delist(FlightRecorder* r) {
  for (auto& slot : g_slots) {
    FlightRecorder* expected = r;
    if (slot.compare_exchange_strong(expected, nullptr)) return;
  }
}

}  // namespace

void prepare_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    throw InvalidArgument(fmt::format(
        "flight recorder: '{}' is not a directory: set DDP_FLIGHT_RECORDER_DIR to a writable "
        "directory, or DDP_FLIGHT_RECORDER_ENTRIES=0 to turn the recorder off",
        dir));
  }
  make_directories(dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw InvalidArgument(fmt::format(
        "flight recorder: cannot write in '{}' ({}): set DDP_FLIGHT_RECORDER_DIR to a writable "
        "directory, or DDP_FLIGHT_RECORDER_ENTRIES=0 to turn the recorder off",
        dir, std::strerror(errno)));
  }
}

std::string file_name(const std::string& group, int rank) {
  std::string g = group;
  for (char& c : g) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) c = '_';
  }
  return fmt::format("{}{}_rank{}{}", kFilePrefix, g, rank, kFileSuffix);
}

// The ring in a file of setup.dir, mapped shared (Note [Flight ring]):
// current at every moment, whatever happens to the process.
void* FlightRecorder::map_file(const RecorderSetup& setup, const std::string& name) {
  make_directories(setup.dir);
  path_ = unused_path(setup.dir, name);
  // Never truncate a file another process may have mapped (a second job
  // sharing the directory would then fault on its mapping): the old file
  // is unlinked and a new one made, exclusively.
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    ::unlink(path_.c_str());
    fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  // Allocated, not sparse: a full disk fails here, not later with SIGBUS
  // on a write to the mapping.
  void* base = MAP_FAILED;
  struct stat st {};
  int err = fd < 0 ? errno : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
  if (err == 0 && ::fstat(fd, &st) == 0) {
    base = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) err = errno;
  }
  if (fd >= 0) ::close(fd);
  if (base == MAP_FAILED) {
    throw InvalidArgument(fmt::format(
        "flight recorder: cannot create '{}' ({}): set DDP_FLIGHT_RECORDER_DIR to a writable "
        "directory, or DDP_FLIGHT_RECORDER_ENTRIES=0 to turn the recorder off",
        path_, std::strerror(err)));
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
  mapped_ = true;
  return base;
}

// The ring in anonymous memory, written to a file of the dump directory at
// an event.
void* FlightRecorder::map_memory(const RecorderSetup& setup, const std::string& name) {
  const std::string dump_dir = setup.dump_dir.empty() ? default_dump_dir() : setup.dump_dir;
  path_ = unused_path(dump_dir, name);
  tmp_prefix_ = fmt::format("{}.tmp{}.", path_, ::getpid());
  // Created at the first dump, not now: a run without an event leaves
  // nothing, not even a directory.
  for (size_t at = dump_dir.find('/', 1); at != std::string::npos; at = dump_dir.find('/', at + 1)) {
    dump_dirs_.push_back(dump_dir.substr(0, at));
  }
  dump_dirs_.push_back(dump_dir);
  notice_ = fmt::format("ddp: flight record of rank {} ({}) written to {} (read it with "
                        "ddp-trace {})\n",
                        setup.rank, setup.group, path_, dump_dir);
  void* base = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    throw InvalidArgument(fmt::format(
        "flight recorder: cannot allocate {} bytes for a ring of {} entries ({}): lower "
        "DDP_FLIGHT_RECORDER_ENTRIES, or set it to 0 to turn the recorder off",
        bytes_, setup.capacity, std::strerror(errno)));
  }
  return base;
}

// Both mappings start as zeros (a new file, anonymous memory): the header
// says what the ring is, the entries stay empty.
void FlightRecorder::write_header(void* base, const RecorderSetup& setup) {
  header_ = static_cast<Header*>(base);
  entries_ = reinterpret_cast<Entry*>(static_cast<char*>(base) + sizeof(Header));
  Header& h = *header_;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.header_size = sizeof(Header);
  h.entry_size = sizeof(Entry);
  h.capacity = setup.capacity;
  h.rank = setup.rank;
  h.world_size = setup.world_size;
  h.local_rank = setup.local_rank;
  h.pid = static_cast<int32_t>(::getpid());
  h.created_us = now_us();
  copy_cut(h.group, sizeof(h.group), setup.group);
  copy_cut(h.backend, sizeof(h.backend), setup.backend);
  copy_cut(h.host, sizeof(h.host), setup.host);
}

std::unique_ptr<FlightRecorder> FlightRecorder::create(const RecorderSetup& setup) {
  if (setup.capacity == 0) return nullptr;
  std::unique_ptr<FlightRecorder> r(new FlightRecorder());
  r->bytes_ = ring_bytes(setup.capacity);
  const std::string name = file_name(setup.group, setup.rank);
  void* base = setup.dir.empty() ? r->map_memory(setup, name) : r->map_file(setup, name);
  r->write_header(base, setup);
  enlist(r.get());
  return r;
}

FlightRecorder::~FlightRecorder() {
  delist(this);
  while (g_busy.load() != 0) ::sched_yield();  // a walk may still hold this
  // A mapped ring of a group that ends without an event is not evidence of
  // anything: removed, so that a successful run leaves no files; unless
  // the name now holds another process's ring, or this is a forked child.
  struct stat st {};
  if (mapped_ && header_->events.load() == 0 && header_->pid == ::getpid() &&
      ::stat(path_.c_str(), &st) == 0 && st.st_dev == device_ && st.st_ino == inode_) {
    ::unlink(path_.c_str());
  }
  ::munmap(header_, bytes_);
}

uint64_t FlightRecorder::started(uint64_t seq, std::string_view op, std::string_view signature,
                                 int64_t step, int bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = header_->written.load(std::memory_order_relaxed);
  Entry& e = entries_[id % header_->capacity];
  e.guard.fetch_add(1, std::memory_order_acq_rel);  // odd: being written
  e.state = static_cast<uint32_t>(State::kStarted);
  e.id = id;
  e.seq = seq;
  e.step = step;
  e.bucket = bucket;
  e.start_us = now_us();
  e.end_us = 0;
  copy_cut(e.op, sizeof(e.op), op);
  copy_cut(e.signature, sizeof(e.signature), signature);
  e.guard.fetch_add(1, std::memory_order_release);
  header_->written.store(id + 1, std::memory_order_release);
  return id;
}

void FlightRecorder::ended(uint64_t id, State state) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[id % header_->capacity];
  if (e.id != id || e.state != static_cast<uint32_t>(State::kStarted)) return;
  e.guard.fetch_add(1, std::memory_order_acq_rel);
  e.state = static_cast<uint32_t>(state);
  e.end_us = now_us();
  e.guard.fetch_add(1, std::memory_order_release);
}

// Note [Kept flight records]
// A ring is evidence of a collective gone wrong, or of where each rank was
// when a job failed; of anything else (a bad flag, a missing file, an error
// after the last collective) it is litter. So an in-memory ring is written
// at an event only when `keep` says the event concerns collectives: an
// explicit dump always; a fatal signal when the ring holds at least one
// collective (the others may be waiting in the next); an error or
// std::terminate only when a collective in the ring did not complete (a
// timeout, a failure, one still running, as at Gloo's aborts). ddprun
// applies the same idea to the rings of all its workers
// (flight::collective_involved) before it keeps them. Reading the entries'
// states is async-signal-safe: plain loads of the ring's memory.
bool FlightRecorder::wanted(Keep keep) const noexcept {
  if (keep == Keep::kAlways) return true;
  const uint64_t written = header_->written.load();
  if (written == 0) return false;
  if (keep == Keep::kIfAnyCollective) return true;
  const uint64_t n = std::min<uint64_t>(written, header_->capacity);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t state = entries_[i].state;
    if (state != static_cast<uint32_t>(State::kEmpty) &&
        state != static_cast<uint32_t>(State::kCompleted)) {
      return true;
    }
  }
  return false;
}

bool FlightRecorder::note_event(const char* reason, bool in_signal_handler, Keep keep) noexcept {
  // Outside a signal handler the dump waits for a writer that is between
  // an entry's two guard increments (bounded: never more than ~100 ms, so a
  // caller that holds mu_ itself cannot deadlock here).
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  for (int i = 0; !in_signal_handler && i < 100 && !lock.try_lock(); ++i) {
    ::usleep(1000);
  }
  Header& h = *header_;
  if (h.events.fetch_add(1) == 0) h.event_us = now_us();
  if (!reason_busy_.test_and_set()) {  // a concurrent event's reason is dropped, not torn
    append(h.reason, sizeof(h.reason), reason);
    reason_busy_.clear();
  }
  if (mapped_) return true;  // the file is the ring
  if (!wanted(keep)) return true;
  for (const std::string& d : dump_dirs_) ::mkdir(d.c_str(), 0755);  // EEXIST is fine
  char tmp[4096];
  numbered(tmp, sizeof(tmp), tmp_prefix_, g_dumps.fetch_add(1));
  ::unlink(tmp);
  int fd = ::open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, reinterpret_cast<const char*>(header_), bytes_);
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp, path_.c_str()) != 0) {
    ::unlink(tmp);
    return false;
  }
  if (!noticed_.exchange(true)) write_all(STDERR_FILENO, notice_.data(), notice_.size());
  return true;
}

void note_event_everywhere(const char* reason, bool in_signal_handler, Keep keep) noexcept {
  g_busy.fetch_add(1);
  for (auto& slot : g_slots) {
    if (FlightRecorder* r = slot.load()) r->note_event(reason, in_signal_handler, keep);
  }
  g_busy.fetch_sub(1);
}

std::vector<std::string> live_paths() {
  std::vector<std::string> out;
  g_busy.fetch_add(1);
  for (auto& slot : g_slots) {
    if (FlightRecorder* r = slot.load()) out.push_back(r->path());
  }
  g_busy.fetch_sub(1);
  return out;
}

namespace {

const char* fatal_reason(int sig) noexcept {
  switch (sig) {
    case SIGSEGV: return "killed by signal 11 (SIGSEGV)";
    case SIGBUS: return "killed by signal 7 (SIGBUS)";
    case SIGILL: return "killed by signal 4 (SIGILL)";
    case SIGFPE: return "killed by signal 8 (SIGFPE)";
    case SIGABRT: return "killed by signal 6 (SIGABRT)";
    default: return "killed by a signal";
  }
}

std::atomic<bool> g_abort_noted{false};  // abort_follows()

void on_fatal_signal(int sig) {
  const int saved = errno;
  if (sig != SIGABRT || !g_abort_noted.load()) {
    note_event_everywhere(fatal_reason(sig), true, Keep::kIfAnyCollective);
  }
  errno = saved;
  // SA_RESETHAND restored the default action; the signal, blocked while
  // this runs, is delivered again on return and ends the process as it
  // would have without us.
  ::raise(sig);
}

void on_sigusr1(int) {
  const int saved = errno;
  note_event_everywhere("SIGUSR1: a dump was requested", true);
  errno = saved;
}

void install_if_default(int sig, void (*handler)(int), int flags) {
  struct sigaction old {};
  if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
      (old.sa_flags & SA_SIGINFO) != 0) {
    return;  // the program (or a sanitizer) handles it
  }
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  ::sigaction(sig, &sa, nullptr);
}

}  // namespace

void abort_follows() noexcept { g_abort_noted.store(true); }

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    install_if_default(SIGUSR1, on_sigusr1, SA_RESTART);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
      install_if_default(sig, on_fatal_signal, SA_RESETHAND);
    }
  });
}

}  // namespace ddp::flight

namespace ddp {

std::vector<std::string> dump_flight_recorder(const std::string& reason) {
  flight::note_event_everywhere(reason.c_str());
  return flight::live_paths();
}

}  // namespace ddp
