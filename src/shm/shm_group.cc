// ShmGroup: the set-up at rendezvous (who shares a host, segments, the
// hosts' leaders), the communication thread, and the Work it completes.
#include "shm/shm_group.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "ddp/error.h"
#include "shm/shm_state.h"

namespace ddp::shm {
namespace {

constexpr size_t kDefaultStaging = size_t{32} << 20;
// The arena holds DDP's buckets (twice the gradients: the rebuilt layout is
// allocated before the first one is freed). Pages cost memory only once
// touched.
constexpr size_t kDefaultArena = size_t{128} << 20;
constexpr size_t kMinStaging = size_t{1} << 20;
constexpr size_t kPage = 4096;

std::string read_link(const char* path) {
  char buf[256];
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
}

// Ranks with equal identities can map each other's segments: same machine
// (host name, boot id), same IPC and network namespaces (containers and
// ip-netns "nodes" are other hosts), same /dev/shm.
std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  ::stat("/dev/shm", &st);
  // The pid namespace too: a peer's pid must mean the same process here
  // (the liveness check, stale-name cleanup).
  return fmt::format("{}|{}|{}|{}|{}|{}", host, boot_id, read_link("/proc/self/ns/ipc"),
                     read_link("/proc/self/ns/net"), read_link("/proc/self/ns/pid"),
                     static_cast<uint64_t>(st.st_dev));
}

std::string random_token() {
  std::random_device rd;  // /dev/urandom
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

std::string get_string(c10d::Store& store, const std::string& key) {
  auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

void set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// Every rank's value of `name` ("shm/<name>/<rank>"), after publishing ours.
std::vector<std::string> exchange(const ShmSetup& s, const std::string& name,
                                  const std::string& mine) {
  set_string(*s.store, fmt::format("shm/{}/{}", name, s.rank), mine);
  std::vector<std::string> keys, out;
  for (int r = 0; r < s.size; ++r) keys.push_back(fmt::format("shm/{}/{}", name, r));
  s.store->wait(keys, s.timeout);
  for (const std::string& k : keys) out.push_back(get_string(*s.store, k));
  return out;
}

struct Report {
  std::string identity;
  pid_t pid = 0;
  int64_t free_bytes = -1;
  size_t staging = 0;  // InitOptions::shared_memory_staging_bytes (0: default)
  std::string problem;
};

std::string encode(const Report& r) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", r.identity, r.pid, r.free_bytes, r.staging,
                     r.problem);
}

Report decode(const std::string& text) {
  Report r;
  std::istringstream in(text);
  std::string pid, free, staging;
  std::getline(in, r.identity);
  std::getline(in, pid);
  std::getline(in, free);
  std::getline(in, staging);
  std::getline(in, r.problem);
  r.pid = static_cast<pid_t>(std::atol(pid.c_str()));
  r.free_bytes = std::atoll(free.c_str());
  r.staging = static_cast<size_t>(std::atoll(staging.c_str()));
  return r;
}

// Maps ranks to hosts (ordered by their lowest rank) and fills s's layout.
void assign_hosts(ShmGroup::State& st, const std::vector<Report>& reports) {
  std::map<std::string, int> host_of;
  for (int r = 0; r < st.size; ++r) {
    auto it = host_of.emplace(reports[r].identity, static_cast<int>(host_of.size())).first;
    if (reports[r].identity == reports[st.rank].identity) {
      if (r == st.rank) st.me = static_cast<int>(st.local.size());
      st.local.push_back(r);
      st.pids.push_back(reports[r].pid);
      st.host = it->second;
    }
  }
  st.hosts = static_cast<int>(host_of.size());
}

// Staging bytes every rank of this host can afford (the same on each); the
// arena gets what is left of the same budget, up to kDefaultArena.
size_t staging_for(ShmGroup::State& st, const std::vector<Report>& reports) {
  // The host's ranks must agree on the sizes (chunks, two-shot slices):
  // the least free space and the smallest request among them.
  int64_t free = INT64_MAX;
  size_t asked = 0;
  for (int r : st.local) {
    free = std::min(free, reports[r].free_bytes);
    if (reports[r].staging > 0) asked = asked ? std::min(asked, reports[r].staging) : reports[r].staging;
  }
  const size_t wanted = asked ? (asked + kPage - 1) / kPage * kPage : kDefaultStaging;
  // Half of /dev/shm at most, shared by the host's ranks.
  const size_t room = free > 0 ? static_cast<size_t>(free) / (2 * st.local.size()) : 0;
  const size_t got = std::min(wanted, room) / kPage * kPage;
  st.arena_bytes = std::min(kDefaultArena, room - std::min(room, got)) / kPage * kPage;
  // Too little to be worth it: smaller than asked and than kMinStaging.
  return got < std::min(wanted, kMinStaging) ? 0 : got;
}

// Creates my segment, maps my peers'. "" or what failed.
std::string map_segments(ShmGroup::State& st, const std::string& token) {
  const size_t bytes = kHeaderBytes + st.staging_bytes + st.arena_bytes;
  try {
    st.segments.resize(st.local.size());
    // The header and staging buffer are reserved now (a full /dev/shm is a
    // clean fallback here, not a SIGBUS later); arena blocks when allocated.
    st.segments[st.me] = std::make_shared<Segment>(Segment::create(
        segment_name(token, st.pids[st.me], st.rank), bytes, kHeaderBytes + st.staging_bytes));
    Segment& mine = *st.segments[st.me];
    if (st.arena_bytes > 0) st.arena->free[st.arena_begin()] = st.arena_bytes;
    auto* c = new (mine.data()) Control();
    c->pid = st.pids[st.me];
    c->rank = st.rank;
    c->magic = Control::kMagic;
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string open_peers(ShmGroup::State& st, const std::string& token) {
  const size_t bytes = kHeaderBytes + st.staging_bytes + st.arena_bytes;
  try {
    for (int k = 0; k < static_cast<int>(st.local.size()); ++k) {
      if (k != st.me) {
        st.segments[k] = std::make_shared<Segment>(
            Segment::open(segment_name(token, st.pids[k], st.local[k]), bytes));
      }
      auto* c = static_cast<Control*>(st.segments[k]->data());
      if (c->magic != Control::kMagic || c->rank != st.local[k]) {
        return fmt::format("segment of rank {} has an unexpected header", st.local[k]);
      }
      st.controls.push_back(c);
      st.bases.push_back(static_cast<char*>(st.segments[k]->data()));
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The first rank's problem among `values` ("" when none has one).
std::string first_problem(const std::vector<std::string>& values) {
  for (size_t r = 0; r < values.size(); ++r) {
    if (!values[r].empty()) return fmt::format("rank {}: {}", r, values[r]);
  }
  return "";
}

// Completed by the communication thread.
class ShmWork : public c10d::Work {
 public:
  void complete(std::exception_ptr error) { finish(std::move(error)); }
};

void serve(ShmGroup::State& st) {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(st.mu);
      st.cv.wait(lock, [&] { return st.stop || !st.queue.empty(); });
      if (st.queue.empty()) return;
      task = std::move(st.queue.front());
      st.queue.pop_front();
    }
    task();
  }
}

}  // namespace

ShmGroup::ShmGroup(std::unique_ptr<State> state) : state_(std::move(state)) {
  State& st = *state_;
  st.thread = std::thread([&st] { serve(st); });
}

ShmGroup::~ShmGroup() {
  State& st = *state_;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.stop = true;
  }
  st.cancel.store(true);  // a wait in progress gives up within 100 ms
  st.cv.notify_all();
  if (st.thread.joinable()) st.thread.join();
  // After a failure a Gloo thread of the leaders' group may still be
  // blocked on a gone host: destroying the backend would join it (and hang
  // the exit). As ~ProcessGroup does with its own backend: leave it be.
  if (!st.broken.empty() && st.leaders) (void)st.leaders.release();
}

int ShmGroup::local_size() const { return static_cast<int>(state_->local.size()); }
int ShmGroup::hosts() const { return state_->hosts; }

std::unique_ptr<ShmGroup> ShmGroup::create(const ShmSetup& s, std::string& reason) {
  reason.clear();
  if (s.size <= 1) return nullptr;
  remove_stale_segments();
  Report mine{host_identity(), ::getpid(), dev_shm_free_bytes(), s.staging_bytes, ""};
  if (!s.enabled) mine.problem = "disabled (InitOptions::shared_memory = false or DDP_SHM=0)";
  else if (mine.free_bytes < 0) mine.problem = "/dev/shm is missing or not writable";
  std::vector<Report> reports;
  std::vector<std::string> problems;
  for (const std::string& text : exchange(s, "host", encode(mine))) {
    reports.push_back(decode(text));
    problems.push_back(reports.back().problem);
  }
  if (!(reason = first_problem(problems)).empty()) return nullptr;

  auto st = std::make_unique<State>();
  st->rank = s.rank;
  st->size = s.size;
  st->one_shot_max_bytes = s.one_shot_max_bytes;
  assign_hosts(*st, reports);
  if (st->hosts == s.size) return nullptr;  // nobody shares a host: nothing to do
  std::string problem;
  if (st->local.size() > 1) {
    st->staging_bytes = staging_for(*st, reports);
    if (st->staging_bytes == 0) {
      problem = fmt::format(
          "/dev/shm has {:.0f} MiB free for {} ranks on this host (Docker's default is 64 MiB: "
          "run the container with --shm-size=1g or --ipc=host)",
          reports[s.rank].free_bytes / 1048576.0, st->local.size());
    }
  }
  if (s.rank == 0) set_string(*s.store, "shm/token", random_token());
  s.store->wait({"shm/token"}, s.timeout);
  const std::string token = get_string(*s.store, "shm/token");
  if (problem.empty() && st->local.size() > 1) problem = map_segments(*st, token);
  if (!(reason = first_problem(exchange(s, "created", problem))).empty()) return nullptr;
  if (st->local.size() > 1) problem = open_peers(*st, token);
  if (!(reason = first_problem(exchange(s, "mapped", problem))).empty()) return nullptr;
  // Note [Shared memory lifetime]: every peer has mapped every segment.
  for (auto& seg : st->segments) seg->unlink();
  if (st->hosts > 1) {
    if (st->me == 0) {
      try {
        auto store = c10::make_intrusive<c10d::PrefixStore>("shm/leaders", s.store);
        st->leaders = compat::make_gloo(store, st->host, st->hosts, s.gloo_address,
                                        s.gloo_threads, s.timeout);
      } catch (const std::exception& e) {
        problem = std::string("the hosts' leaders could not connect: ") +
                  compat::what_without_backtrace(e);
      }
    }
    if (!(reason = first_problem(exchange(s, "leaders", problem))).empty()) return nullptr;
  }
  return std::unique_ptr<ShmGroup>(new ShmGroup(std::move(st)));
}

namespace {

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    default: return DType::kFloat32;
  }
}

Op op_of(const c10d::ReduceOp& op) {
  if (op == c10d::ReduceOp::MIN) return Op::kMin;
  if (op == c10d::ReduceOp::MAX) return Op::kMax;
  if (op == c10d::ReduceOp::PRODUCT) return Op::kProduct;
  return Op::kSum;
}

}  // namespace

namespace {

// Queues `run` (on a contiguous copy of `tensor`, written back after) on the
// communication thread; its Work completes when `run` returns or throws.
// The first failure makes the state unusable for every later operation.
c10::intrusive_ptr<c10d::Work> submit(ShmGroup::State& st, const at::Tensor& tensor,
                                      std::function<void(at::Tensor&)> run) {
  auto work = c10::make_intrusive<ShmWork>();
  auto task = [&st, t = tensor, run = std::move(run), work] {
    try {
      if (!st.broken.empty()) {
        throw std::runtime_error("shared memory: an earlier collective of this group failed (" +
                                 st.broken + "); the group is unusable: destroy it");
      }
      at::NoGradGuard no_grad;
      at::Tensor c = t.contiguous();
      run(c);
      if (!c.is_same(t)) t.copy_(c);
      work->complete(nullptr);
    } catch (const std::exception& e) {
      if (st.broken.empty()) st.broken = e.what();
      work->complete(std::current_exception());
    }
  };
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.queue.push_back(std::move(task));
  }
  st.cv.notify_one();
  return work;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ShmGroup::all_reduce(const at::Tensor& tensor,
                                                    c10d::ReduceOp op,
                                                    std::chrono::milliseconds timeout) {
  State& st = *state_;
  const auto deadline = Clock::now() + timeout;
  return submit(st, tensor, [&st, dtype = dtype_of(tensor.scalar_type()), o = op_of(op), timeout,
                             deadline](at::Tensor& c) {
    run_all_reduce(st, static_cast<char*>(c.data_ptr()), static_cast<size_t>(c.numel()), dtype, o,
                   deadline, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ShmGroup::broadcast(const at::Tensor& tensor, int root,
                                                   std::chrono::milliseconds timeout) {
  State& st = *state_;
  if (st.hosts != 1 || static_cast<int>(st.local.size()) != st.size) return {};
  const auto deadline = Clock::now() + timeout;
  return submit(st, tensor, [&st, dtype = dtype_of(tensor.scalar_type()), root, timeout,
                             deadline](at::Tensor& c) {
    run_broadcast(st, static_cast<char*>(c.data_ptr()), c.numel() * c.element_size(), dtype,
                  root, deadline, timeout);
  });
}

at::Tensor ShmGroup::allocate(int64_t numel, at::ScalarType dtype) {
  State& st = *state_;
  if (st.local.size() < 2 || numel <= 0) return at::Tensor();
  const size_t bytes = (static_cast<size_t>(numel) * c10::elementSize(dtype) + 63) / 64 * 64;
  size_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(st.arena->mu);
    auto& free = st.arena->free;
    auto it = std::find_if(free.begin(), free.end(),
                           [&](const auto& block) { return block.second >= bytes; });
    if (it == free.end()) return at::Tensor();  // full: the caller copies
    // Memory for the block now, or ordinary memory (/dev/shm filled up).
    if (!st.segments[st.me]->reserve(it->first, bytes)) return at::Tensor();
    offset = it->first;
    const size_t left = it->second - bytes;
    free.erase(it);
    if (left > 0) free[offset + bytes] = left;
  }
  // The deleter returns the block, and keeps the segment mapped meanwhile.
  std::shared_ptr<Segment> segment = st.segments[st.me];
  auto release = [keep = segment, arena = st.arena, offset, bytes](void*) {
    std::lock_guard<std::mutex> lock(arena->mu);
    auto& free = arena->free;
    auto it = free.emplace(offset, bytes).first;
    auto next = std::next(it);
    if (next != free.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free.erase(next);
    }
    if (it != free.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free.erase(it);
      }
    }
  };
  char* data = static_cast<char*>(segment->data()) + offset;
  return at::from_blob(data, {numel}, release, at::TensorOptions().dtype(dtype));
}

void ShmGroup::fence(std::chrono::milliseconds timeout) {
  State& st = *state_;
  auto work = c10::make_intrusive<ShmWork>();
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.queue.push_back([&st, work, deadline, timeout] {
      try {
        if (!st.broken.empty()) {
          throw std::runtime_error("shared memory: an earlier collective of this group failed (" +
                                   st.broken + ")");
        }
        wait_for_readers(st, deadline, timeout);
        work->complete(nullptr);
      } catch (...) {
        work->complete(std::current_exception());
      }
    });
  }
  st.cv.notify_one();
  work->wait();
}

bool ShmGroup::supports(const at::Tensor& t, c10d::ReduceOp op) {
  if (!t.defined() || t.device().type() != c10::DeviceType::CPU || t.is_sparse()) return false;
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kInt: case at::kLong: break;
    default: return false;
  }
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::MAX ||
         op == c10d::ReduceOp::PRODUCT;
}

}  // namespace ddp::shm
