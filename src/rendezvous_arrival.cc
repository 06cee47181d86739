#include "rendezvous_arrival.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <thread>
#include <vector>

#include "compat/torch_compat.h"
#include "ddp/error.h"
#include "ddp/logging.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

int64_t counter(c10d::Store& store, const std::string& key) {
  return store.add(key, 0);
}

// The host's grace: until every rank that took part has seen the error.
void linger_until_seen(const Arrival& a) {
  const auto until = Clock::now() + std::min(a.timeout, std::chrono::milliseconds(5000));
  while (Clock::now() < until &&
         counter(a.store, "error_seen") <
             counter(a.store, "arrived") + counter(a.store, "duplicates")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

[[noreturn]] void fail(const Arrival& a, char kind, const std::string& msg) {
  a.store.add("error_seen", 1);
  if (a.hosts_store) linger_until_seen(a);
  if (kind == 'T') throw TimeoutError(msg);
  throw InvalidArgument(msg);
}

[[noreturn]] void publish_and_fail(const Arrival& a, char kind, const std::string& msg) {
  std::string value = kind + msg;
  a.store.set("error", std::vector<uint8_t>(value.begin(), value.end()));
  fail(a, kind, msg);
}

std::vector<int> missing_ranks(const Arrival& a) {
  std::vector<int> missing;
  for (int i = 0; i < a.size; ++i) {
    if (!a.store.check({fmt::format("rank/{}", i)})) missing.push_back(i);
  }
  return missing;
}

std::string timeout_message(const Arrival& a, int64_t arrived) {
  const std::vector<int> missing = missing_ranks(a);
  return fmt::format(
      "rendezvous at {} timed out after {} s on rank {}: {} of {} arrived, {} missing "
      "({} {}). Start all WORLD_SIZE={} processes, or lower WORLD_SIZE",
      a.address, seconds(a.timeout), a.rank, arrived, ranks_text(a.size), missing.size(),
      missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "), a.size);
}

// Note [Arrival protocol], step 4: a rank that waits says so, naming whom.
void report_waiting(const Arrival& a, Clock::duration waited) {
  const std::vector<int> missing = missing_ranks(a);
  if (missing.empty()) return;  // all there: the next poll returns
  log(LogLevel::kWarning,
      fmt::format("rendezvous: rank {} is waiting for {} of {} ({} {}) at {} for {:.0f} s; "
                  "it gives up after {} s (the timeout). Start all WORLD_SIZE={} processes, "
                  "or lower WORLD_SIZE",
                  a.rank, missing.size(), ranks_text(a.size),
                  missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "), a.address,
                  std::chrono::duration<double>(waited).count(), seconds(a.timeout), a.size));
}

// The first rank to arrive records its world size; a rank given another
// fails, and makes every rank fail at once naming both values (else the
// job would end after the whole timeout in a Gloo socket error).
void check_world_size(const Arrival& a) {
  const std::string mine = std::to_string(a.size);
  std::vector<uint8_t> seen;
  try {
    seen = a.store.compareSet("world_size", {}, std::vector<uint8_t>(mine.begin(), mine.end()));
  } catch (const std::exception&) {
    return;  // a store without compare-and-set (a user's own): no check
  }
  const std::string first(seen.begin(), seen.end());
  if (first == mine) return;
  publish_and_fail(a, 'I', fmt::format(
      "the ranks disagree on the world size at the rendezvous {}: rank {} was started with "
      "WORLD_SIZE={}, but the ranks before it with WORLD_SIZE={}. Give every process of the "
      "job the same WORLD_SIZE (under a launcher: the same --nnodes and --nproc-per-node on "
      "every node)",
      a.address, a.rank, mine, first));
}

void await_arrivals(const Arrival& a) {
  const auto deadline = Clock::now() + a.timeout;
  check_world_size(a);
  if (a.store.add(fmt::format("rank/{}", a.rank), 1) > 1) {
    a.store.add("duplicates", 1);
    publish_and_fail(a, 'I', fmt::format(
        "two processes claim rank {} (world size {}) at the rendezvous {}: "
        "give each process a distinct RANK in [0, {})",
        a.rank, a.size, a.address, a.size));
  }
  a.store.add("arrived", 1);
  const auto start = Clock::now();
  auto next_report = start + a.report_every;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (a.store.check({"error"})) {
      auto v = a.store.get("error");
      fail(a, v.empty() ? 'I' : static_cast<char>(v[0]),
           v.empty() ? "" : std::string(v.begin() + 1, v.end()));
    }
    int64_t arrived = counter(a.store, "arrived");
    if (arrived >= a.size) return;
    const auto now = Clock::now();
    if (now > deadline) publish_and_fail(a, 'T', timeout_message(a, arrived));
    if (a.report_every.count() > 0 && now >= next_report) {
      report_waiting(a, now - start);
      next_report += a.report_every;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

// c10d's TCPStore (1.13) reads a reply without a time limit, except after
// wait(), which bounds that read and the socket's later ones by its timeout.
// Without this, a port whose owner accepts connections but never answers
// (another program) would hang the rendezvous forever.
void bound_store_reads(const Arrival& a) {
  try {
    a.store.wait({}, a.timeout);
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format(
        "rank {}: no rendezvous store answered at {} within {} s ({}). Is "
        "that rank 0's store, and not another program's port? Check "
        "MASTER_ADDR/MASTER_PORT",
        a.rank, a.address, seconds(a.timeout), inner_message(e)));
  }
}

}  // namespace

double seconds(std::chrono::milliseconds d) { return d.count() / 1000.0; }

std::string ranks_text(int64_t n) { return fmt::format("{} {}", n, n == 1 ? "rank" : "ranks"); }

std::string inner_message(const std::exception& e) {
  std::string msg = compat::what_without_backtrace(e);
  while (!msg.empty() && (msg.back() == '.' || msg.back() == '\n')) msg.pop_back();
  return msg;
}

void check_arrivals(const Arrival& a) {
  if (a.tcp) bound_store_reads(a);
  try {
    await_arrivals(a);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rendezvous at {} failed on rank {}: {}{}", a.address, a.rank,
        inner_message(e),
        a.rank != 0 ? ". The store's host (rank 0) may have failed or exited"
                    : ""));
  }
}

void claim_rank0_on_busy_port(const std::string& host, int port,
                              const std::string& prefix, int size,
                              const std::string& address,
                              std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = std::min(timeout, std::chrono::milliseconds(2000));
    auto base = compat::connect_tcp_store(host, o, o.timeout);
    if (!base) return;  // accepts but never answers: not a store
    store = c10::make_intrusive<c10d::PrefixStore>(prefix, base);
    // wait() bounds the wait for the reply (and later reads on the socket)
    // by its timeout; check() would block forever on a port whose owner
    // accepts but never answers.
    store->wait({"rank/0"}, o.timeout);
    if (counter(*store, "arrived") >= size) return;
  } catch (const std::exception&) {
    return;  // not a store, or not answering: some other program's port
  }
  check_arrivals(Arrival{*store, 0, size, address, timeout, false, true});
}

}  // namespace ddp::detail
