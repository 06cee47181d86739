// The steps of Note [Shared-memory all-reduce] (shm_group.h), run on the
// group's communication thread.
#include <fmt/format.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "ddp/error.h"
#include "proc_stat.h"
#include "shm/shm_state.h"

namespace ddp::shm {
namespace {

// Checks of a peer's progress before sleeping; each is a load and a pause.
constexpr int kSpins = 1000;
// Longest sleep on a futex: also how often a peer's liveness is checked.
constexpr auto kSleepSlice = std::chrono::milliseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;  // wrap-safe
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// False once `pid` has exited (gone, or a zombie not yet reaped).
bool alive(pid_t pid) {
  if (pid == ::getpid()) return true;  // ranks as threads of one process
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // Unreadable counts as alive: the collective's timeout still bounds the wait.
  const std::string state = detail::proc_stat_field(pid, 3);
  return state.empty() || (state[0] != 'Z' && state[0] != 'X');
}

void signal_phase(ShmGroup::State& s, uint32_t phase) {
  Control* me = s.controls[s.me];
  s.phase = phase;
  me->phase.store(phase, std::memory_order_seq_cst);
  if (me->waiters.load(std::memory_order_seq_cst) > 0) {
    futex(&me->phase, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

// Waits until local peer k has signalled `target` (spin, then sleep).
void wait_peer(ShmGroup::State& s, int k, uint32_t target, Clock::time_point deadline,
               std::chrono::milliseconds timeout) {
  Control* c = s.controls[k];
  for (int i = 0; i < kSpins; ++i) {
    if (reached(c->phase.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  while (true) {
    c->waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c->phase.load(std::memory_order_seq_cst);
    if (!reached(seen, target)) {
      const auto left = std::min<Clock::duration>(deadline - Clock::now(), kSleepSlice);
      timespec ts{0, std::max<long>(
                         std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 0)};
      futex(&c->phase, FUTEX_WAIT, seen, &ts);
    }
    c->waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c->phase.load(std::memory_order_acquire), target)) return;
    // Plain exceptions: the collective's boundary (work.cc) names the
    // operation and gives them ddp's types (Note [Shared-memory all-reduce]).
    if (s.cancel.load()) throw std::runtime_error("shared memory: the process group was destroyed");
    if (!alive(s.pids[k])) {
      throw std::runtime_error(fmt::format(
          "shared memory: rank {} (pid {}, on this host) exited while this collective was "
          "running (it probably crashed or was killed)",
          s.local[k], s.pids[k]));
    }
    if (Clock::now() >= deadline) {
      throw std::runtime_error(fmt::format(
          // work.cc adds the advice ("A rank may have stopped, ...").
          "shared memory: timed out after {:.1f} s waiting for rank {} (on this host)",
          timeout.count() / 1000.0, s.local[k]));
    }
  }
}

void wait_peers(ShmGroup::State& s, uint32_t target, Clock::time_point deadline,
                std::chrono::milliseconds timeout) {
  for (int k = 0; k < static_cast<int>(s.local.size()); ++k) {
    if (k != s.me) wait_peer(s, k, target, deadline, timeout);
  }
}

// Every slice starts on a cache line (64 bytes) so that no two ranks write
// one line; [begin, end) in elements for local rank k.
std::pair<size_t, size_t> slice_of(size_t count, size_t esize, int parts, int k) {
  const size_t align = std::max<size_t>(64 / esize, 1);
  size_t per = (count + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  const size_t begin = std::min(count, per * k);
  return {begin, std::min(count, begin + per)};
}

const char* dtype_name(uint32_t d) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  return d < 6 ? names[d] : "?";
}

// "all_reduce SUM" or "broadcast from rank 1": what Control::Op::op says.
std::string op_name(const ShmGroup::State& s, uint32_t o) {
  static const char* names[] = {"SUM", "MIN", "MAX", "PRODUCT"};
  if (o >= Control::kBroadcastOp && o - Control::kBroadcastOp < s.local.size()) {
    return fmt::format("broadcast from rank {}", s.local[o - Control::kBroadcastOp]);
  }
  return fmt::format("all_reduce {}", o < 4 ? names[o] : "?");
}

// Every local peer is in the same operation as this rank (same size, dtype,
// op and chunk), else the ranks are out of step: each rank sees it.
void check_same_operation(ShmGroup::State& s) {
  const Control::Op& mine = s.controls[s.me]->current;
  for (int k = 0; k < static_cast<int>(s.local.size()); ++k) {
    const Control::Op& theirs = s.controls[k]->current;
    if (theirs.total == mine.total && theirs.offset == mine.offset &&
        theirs.count == mine.count && theirs.dtype == mine.dtype && theirs.op == mine.op) {
      continue;
    }
    throw std::runtime_error(fmt::format(
        "the ranks are out of step: rank {} runs {} of {} {} elements (chunk of {} at {}) "
        "where rank {} (this one) runs {} of {} {} elements (chunk of {} at {}). The ranks "
        "issued different collectives "
        "(or one collective with different sizes); typically one rank left the training loop "
        "early (uneven data) and went on to other collectives. Use ddp::join(model, loop) for "
        "uneven inputs, and run with DDP_DEBUG=1 to have every rank name the first collective "
        "that differs",
        s.local[k], op_name(s, theirs.op), theirs.total, dtype_name(theirs.dtype), theirs.count,
        theirs.offset, s.rank, op_name(s, mine.op), mine.total, dtype_name(mine.dtype),
        mine.count, mine.offset));
  }
}

// Note [Shared-memory all-reduce], steps 0-3, for one chunk of `total`
// elements starting at element `offset`. A chunk that already lies in this
// rank's arena (a DDP bucket) is its own source: no copy in, and the
// two-shot reduction happens in place.
void local_chunk(ShmGroup::State& s, char* data, size_t count, size_t total, size_t offset,
                 DType dtype, Op op, Clock::time_point deadline,
                 std::chrono::milliseconds timeout) {
  const size_t esize = element_size(dtype);
  const size_t bytes = count * esize;
  const int L = static_cast<int>(s.local.size());
  char* base = s.bases[s.me];
  const bool in_place =
      data >= base + s.arena_begin() && data + bytes <= base + s.segments[s.me]->size();
  char* source = in_place ? data : s.staging(s.me);
  wait_peers(s, s.phase, deadline, timeout);  // 0: they are done with my buffer
  if (!in_place) std::memcpy(source, data, bytes);
  s.controls[s.me]->current = {total, offset, count, static_cast<uint64_t>(source - base),
                               static_cast<uint32_t>(dtype), static_cast<uint32_t>(op)};
  signal_phase(s, s.phase + 1);  // 1: input ready
  wait_peers(s, s.phase, deadline, timeout);
  check_same_operation(s);
  std::vector<const char*> sources(L);
  for (int k = 0; k < L; ++k) sources[k] = s.bases[k] + s.controls[k]->current.source;
  std::vector<const void*> srcs(L);
  if (bytes <= s.one_shot_max_bytes) {
    // In place, the peers still read `data`: sum into my (idle) staging
    // buffer, and copy back once they are done.
    char* dst = in_place ? s.staging(s.me) : data;
    for (int k = 0; k < L; ++k) srcs[k] = sources[k];
    reduce(dtype, op, dst, srcs.data(), L, count);
    signal_phase(s, s.phase + 1);  // 3: done reading
    if (in_place) {
      wait_peers(s, s.phase, deadline, timeout);
      std::memcpy(data, dst, bytes);
    }
    return;
  }
  auto [begin, end] = slice_of(count, esize, L, s.me);
  for (int k = 0; k < L; ++k) srcs[k] = sources[k] + begin * esize;
  if (end > begin) reduce(dtype, op, source + begin * esize, srcs.data(), L, end - begin);
  signal_phase(s, s.phase + 1);  // my slice is reduced
  wait_peers(s, s.phase, deadline, timeout);
  for (int k = 0; k < L; ++k) {
    auto [b, e] = slice_of(count, esize, L, k);
    if (e > b && !(k == s.me && in_place)) {
      std::memcpy(data + b * esize, sources[k] + b * esize, (e - b) * esize);
    }
  }
  signal_phase(s, s.phase + 1);  // 3: done reading
}

// The leader's result to every local rank, through the leader's buffer.
void local_broadcast_chunk(ShmGroup::State& s, char* data, size_t bytes,
                           Clock::time_point deadline, std::chrono::milliseconds timeout) {
  wait_peers(s, s.phase, deadline, timeout);
  if (s.me == 0) std::memcpy(s.staging(0), data, bytes);
  signal_phase(s, s.phase + 1);
  wait_peers(s, s.phase, deadline, timeout);
  if (s.me != 0) std::memcpy(data, s.staging(0), bytes);
  signal_phase(s, s.phase + 1);
}

c10d::ReduceOp to_c10d(Op op) {
  switch (op) {
    case Op::kSum: return c10d::ReduceOp::SUM;
    case Op::kMin: return c10d::ReduceOp::MIN;
    case Op::kMax: return c10d::ReduceOp::MAX;
    case Op::kProduct: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
  }
  return at::kFloat;
}

// The hosts' sums, all-reduced among the leaders with Gloo, on a tensor of
// its own: if the wait gives up while a Gloo thread still works on it (a
// host gone), that thread writes into memory the work keeps alive, not into
// the caller's (or the arena's).
void leaders_all_reduce(ShmGroup::State& s, char* data, size_t count, DType dtype, Op op,
                        Clock::time_point deadline) {
  const size_t bytes = count * element_size(dtype);
  std::vector<at::Tensor> t{at::empty({static_cast<int64_t>(count)},
                                      at::TensorOptions().dtype(to_scalar_type(dtype)))};
  std::memcpy(t[0].data_ptr(), data, bytes);
  const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - Clock::now()),
                             std::chrono::milliseconds(1));
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = left;
  auto work = s.leaders->allreduce(t, o);
  try {
    work->wait(left);
    std::memcpy(data, t[0].data_ptr(), bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("all_reduce among the hosts' leaders (host {} of {}): {}",
                                         s.host, s.hosts, compat::what_without_backtrace(e)));
  }
}

}  // namespace

void wait_for_readers(ShmGroup::State& s, Clock::time_point deadline,
                      std::chrono::milliseconds timeout) {
  if (s.local.size() > 1) wait_peers(s, s.phase, deadline, timeout);
}

// Note [Shared-memory all-reduce], broadcast: the root copies each chunk
// into its staging buffer, every other rank copies it out.
void run_broadcast(ShmGroup::State& s, char* data, size_t bytes, DType dtype, int root,
                   Clock::time_point deadline, std::chrono::milliseconds timeout) {
  for (size_t off = 0; off < bytes; off += s.staging_bytes) {
    const size_t n = std::min(s.staging_bytes, bytes - off);
    wait_peers(s, s.phase, deadline, timeout);  // 0: done with the root's buffer
    if (s.me == root) std::memcpy(s.staging(root), data + off, n);
    const size_t es = element_size(dtype);  // staging_bytes is a multiple of pages
    s.controls[s.me]->current = {bytes / es, off / es, n / es, kHeaderBytes,
                                 static_cast<uint32_t>(dtype),
                                 Control::kBroadcastOp + static_cast<uint32_t>(root)};
    signal_phase(s, s.phase + 1);  // 1: the root's chunk is staged
    wait_peers(s, s.phase, deadline, timeout);
    check_same_operation(s);
    if (s.me != root) std::memcpy(data + off, s.staging(root), n);
    signal_phase(s, s.phase + 1);  // 3: done reading
  }
}

void run_all_reduce(ShmGroup::State& s, char* data, size_t count, DType dtype, Op op,
                    Clock::time_point deadline, std::chrono::milliseconds timeout) {
  const size_t esize = element_size(dtype);
  const size_t chunk = s.staging_bytes / esize;
  const bool local = s.local.size() > 1;
  if (local) {
    for (size_t off = 0; off < count; off += chunk) {
      local_chunk(s, data + off * esize, std::min(chunk, count - off), count, off, dtype, op,
                  deadline, timeout);
    }
  }
  if (s.hosts == 1) return;
  if (s.me == 0) leaders_all_reduce(s, data, count, dtype, op, deadline);
  if (local) {
    for (size_t off = 0; off < count; off += chunk) {
      local_broadcast_chunk(s, data + off * esize, std::min(chunk, count - off) * esize, deadline,
                            timeout);
    }
  }
}

}  // namespace ddp::shm
