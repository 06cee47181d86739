// Internal: the stall inspector and the debug-mode consistency check of a
// process group (docs/errors.md, "Stalls").
//
// Note [Progress publication]
// Every collective records, in memory, the sequence number and description
// of the last collective this rank started and finished, and the training
// step (DistributedDataParallel's iteration). A background thread writes
// that record to the group's store ("progress/<rank>") soon after it changes
// (woken by the change; at most one write per kMinPublishSpacing, 100 ms,
// so that a stream of small collectives costs rank 0's store at most ten
// writes a second per rank) and at least every
// few seconds, through its own store connection with a short timeout, so a
// stuck store can delay it but never block the ranks. Woken rather than
// polled, the record a stopped or dead rank leaves is its last state but
// for the last 100 ms, not a picture from seconds before. When a
// collective waits longer than the warning threshold, or times out, the
// waiting rank reads every rank's record and names the ranks that have not
// reached the collective and what each was last doing; a record that has
// not been refreshed for long means a rank that is stopped or dead.
//
// Note [Debug mode]
// With InitOptions::debug_collectives (or DDP_DEBUG=1, or PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL) every rank writes, before each collective,
// its fingerprint (operation, root, shapes, dtypes) under
// "check/<seq>/<rank>", waits for all ranks' fingerprints of that sequence
// number and compares them with rank 0's. Every rank sees the same keys, so
// every rank throws the same MismatchError naming the first rank that
// differs, before Gloo can pair mismatched operations (which aborts the
// process). Costs a few store round trips per collective: debugging only.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ddp::detail {

// Note [Progress publication]: the shortest gap between two writes.
inline constexpr std::chrono::milliseconds kMinPublishSpacing{100};

struct MonitorOptions {
  std::chrono::milliseconds warn_after{60'000};
  std::chrono::milliseconds publish_every{2'000};
  bool debug = false;
};

class CollectiveMonitor {
 public:
  // `store`: the group's store; `publish_store`: a connection for the
  // publisher thread and stall reports whose reads are bounded (the same
  // object for in-process and file stores); null: neither publication nor
  // reports.
  CollectiveMonitor(c10::intrusive_ptr<c10d::Store> store,
                    c10::intrusive_ptr<c10d::Store> publish_store, int rank, int size,
                    MonitorOptions options);
  ~CollectiveMonitor();
  CollectiveMonitor(const CollectiveMonitor&) = delete;
  CollectiveMonitor& operator=(const CollectiveMonitor&) = delete;

  void started(uint64_t seq, const std::string& what);
  void finished(uint64_t seq);
  void set_step(int64_t step);

  bool debug() const { return options_.debug; }
  std::chrono::milliseconds warn_after() const { return options_.warn_after; }
  // Debug mode: see Note [Debug mode]. Throws MismatchError or TimeoutError.
  void check_consistency(uint64_t seq, const std::string& what, const std::string& fingerprint,
                         std::chrono::milliseconds timeout);
  // "rank 1 has not reached it: last at step 4, started barrier #9 (...)
  // and finished it; its progress was published 1.2 s ago" for every rank
  // behind collective `seq`; "" when the store cannot be read.
  std::string stall_report(uint64_t seq);

  // Note [Last words]: a rank dying of an error it cannot throw (Gloo's
  // size check fails on its transport thread and terminates the process)
  // leaves `message` in the store under "fatal/<rank>" first, best effort;
  // the ranks that then see its connection close read it back with
  // fatal_notes() ("rank 1: ...", one line per rank; "" when none appears
  // within `wait`). Never throws.
  void publish_fatal(const std::string& message) noexcept;
  std::string fatal_notes(std::chrono::milliseconds wait) noexcept;

 private:
  std::string record() const;
  void publish_loop();

  c10::intrusive_ptr<c10d::Store> store_, publish_store_;
  const int rank_, size_;
  const MonitorOptions options_;
  mutable std::mutex mu_;
  uint64_t started_seq_ = 0, finished_seq_ = 0;  // guarded by mu_; seq + 1
  std::string started_what_;                      // guarded by mu_
  std::atomic<int64_t> step_{-1};
  std::atomic<uint64_t> version_{0};
  bool stop_ = false;  // guarded by mu_
  std::condition_variable cv_;
  std::thread publisher_;
};

}  // namespace ddp::detail
