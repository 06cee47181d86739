// The stall inspector and the debug-mode check; see collective_monitor.h.
#include "collective_monitor.h"

#include <fmt/format.h>

#include <sstream>

#include "compat/torch_compat.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> as_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

struct Record {
  uint64_t started = 0, finished = 0;  // seq + 1; 0 = none
  int64_t step = -1, time_ms = 0;
  std::string what;
};

Record parse_record(const std::string& text) {
  Record r;
  std::istringstream in(text);
  in >> r.started >> r.finished >> r.step >> r.time_ms;
  in.ignore(1);
  std::getline(in, r.what);
  return r;
}

}  // namespace

CollectiveMonitor::CollectiveMonitor(c10::intrusive_ptr<c10d::Store> store,
                                     c10::intrusive_ptr<c10d::Store> publish_store, int rank,
                                     int size, MonitorOptions options)
    : store_(std::move(store)),
      publish_store_(std::move(publish_store)),
      rank_(rank),
      size_(size),
      options_(options) {
  if (size_ > 1 && publish_store_) publisher_ = std::thread([this] { publish_loop(); });
}

CollectiveMonitor::~CollectiveMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (publisher_.joinable()) publisher_.join();
}

void CollectiveMonitor::started(uint64_t seq, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_seq_ = seq + 1;
    started_what_ = what;
    ++version_;
  }
  cv_.notify_one();
}

void CollectiveMonitor::finished(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (seq + 1 > finished_seq_) finished_seq_ = seq + 1;
    ++version_;
  }
  cv_.notify_one();
}

void CollectiveMonitor::set_step(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (step_.exchange(step) == step) return;
    ++version_;
  }
  cv_.notify_one();
}

std::string CollectiveMonitor::record() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format("{} {} {} {} {}", started_seq_, finished_seq_, step_.load(), unix_ms(),
                     started_what_);
}

void CollectiveMonitor::publish_loop() {
  const std::string key = fmt::format("progress/{}", rank_);
  // ~0: the first record goes out at once, so that a rank stopped early is
  // still reported as "has not reached it" with its step, not as silent.
  uint64_t published = ~uint64_t{0};
  while (true) {
    {
      // Woken by a change (Note [Progress publication]), else a refresh.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.publish_every,
                   [&] { return stop_ || version_.load() != published; });
      if (stop_) return;
      published = version_.load();
    }
    try {
      publish_store_->set(key, as_bytes(record()));
    } catch (const std::exception&) {
      // The store is unreachable (rank 0 gone?): the collectives will say so.
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, kMinPublishSpacing, [&] { return stop_; })) return;
  }
}

void CollectiveMonitor::publish_fatal(const std::string& message) noexcept {
  if (!publish_store_) return;
  try {
    publish_store_->set(fmt::format("fatal/{}", rank_), as_bytes(message));
  } catch (...) {
  }
}

std::string CollectiveMonitor::fatal_notes(std::chrono::milliseconds wait) noexcept {
  if (!publish_store_) return "";
  const auto deadline = std::chrono::steady_clock::now() + wait;
  try {
    while (true) {
      std::string notes;
      for (int k = 0; k < size_; ++k) {
        const std::string key = fmt::format("fatal/{}", k);
        if (k == rank_ || !publish_store_->check({key})) continue;
        notes += (notes.empty() ? "" : "\n") + as_string(publish_store_->get(key));
      }
      if (!notes.empty() || std::chrono::steady_clock::now() >= deadline) return notes;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (...) {
    return "";
  }
}

std::string CollectiveMonitor::stall_report(uint64_t seq) {
  if (!publish_store_) return "";
  std::vector<std::string> lines;
  try {
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      const std::string key = fmt::format("progress/{}", k);
      if (!publish_store_->check({key})) {
        lines.push_back(fmt::format(
            "rank {} has published no progress yet (still starting, or stopped, hung or dead)", k));
        continue;
      }
      Record r = parse_record(as_string(publish_store_->get(key)));
      if (r.started >= seq + 1) continue;  // it has reached this collective
      std::string last =
          r.started == 0 ? std::string("no collective yet")
                         : fmt::format("{} {} it", r.what,
                                       r.finished >= r.started ? "and finished" : "and is still in");
      lines.push_back(fmt::format(
          "rank {} has not reached it: at step {}, last started {}; its progress was published "
          "{:.1f} s ago{}",
          k, r.step, last, (unix_ms() - r.time_ms) / 1000.0,
          unix_ms() - r.time_ms > 4 * options_.publish_every.count()
              ? " (stale: the rank may be stopped, hung or dead)"
              : ""));
    }
  } catch (const std::exception& e) {
    lines.push_back(fmt::format("(progress of the other ranks unavailable: {})",
                                compat::what_without_backtrace(e)));
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "; ") + l;
  return out;
}

void CollectiveMonitor::check_consistency(uint64_t seq, const std::string& what,
                                          const std::string& fingerprint,
                                          std::chrono::milliseconds timeout) {
  if (size_ == 1) return;
  auto key = [&](uint64_t s, int k) { return fmt::format("check/{}/{}", s, k); };
  store_->set(key(seq, rank_), as_bytes(fingerprint + "\n" + what));
  std::vector<std::string> keys;
  for (int k = 0; k < size_; ++k) keys.push_back(key(seq, k));
  try {
    store_->wait(keys, timeout);
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format(
        "debug check before {} timed out after {:.1f} s: not every rank reached collective #{}. "
        "{}",
        what, timeout.count() / 1000.0, seq, stall_report(seq)));
  }
  std::vector<std::pair<std::string, std::string>> all;  // fingerprint, what
  for (const auto& k : keys) {
    std::string v = as_string(store_->get(k));
    auto nl = v.find('\n');
    all.emplace_back(v.substr(0, nl), nl == std::string::npos ? "" : v.substr(nl + 1));
  }
  if (seq >= 2) store_->deleteKey(key(seq - 2, rank_));
  for (int k = 1; k < size_; ++k) {
    if (all[k].first == all[0].first) continue;
    throw MismatchError(fmt::format(
        "collective #{} differs across ranks: rank 0 called {} [{}] but rank {} called {} [{}]. "
        "Every rank must issue the same collectives in the same order with the same shapes "
        "(uneven inputs? see ddp::join)",
        seq, all[0].second, all[0].first, k, all[k].second, all[k].first));
  }
}

}  // namespace ddp::detail
