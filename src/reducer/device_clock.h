// Internal: the reducer's stopwatch, on the host for CPU modules and on the
// device's stream for CUDA ones.
//
// Note [Device timing]
// On CUDA the host only queues kernels: a host clock read at the end of
// backward says when the last kernel was queued, not when it ran, so
// DdpStats' compute and communication times would measure the launch queue.
// A DeviceClock for a CUDA device records a c10::Event (with timing) on the
// calling thread's current stream at each mark; an interval is the events'
// elapsed time. Reading it needs the later event completed, so an
// iteration's intervals are taken at the next begin_sample() or settle()
// (by then the optimizer step and the next forward have normally run, and
// the wait is nil), never at the end of backward, which would cost the host
// a wait of its own. For a CPU device the marks are steady_clock readings.
// Not thread-safe: the reducer calls it under its mutex.
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>

namespace ddp::detail {

class DeviceClock {
 public:
  // The moments of one synchronised backward.
  enum Mark { kBackwardStart, kFirstLaunch, kComputeEnd, kEnd, kMarks };

  explicit DeviceClock(c10::Device device);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  // Starts an iteration: settles the previous one, then marks kBackwardStart.
  void begin_sample();
  void mark(Mark m);
  bool marked(Mark m) const;
  // The iteration is complete; sampled: whether its intervals count
  // (the first iteration, with its set-up, does not). communicated: whether
  // kFirstLaunch was marked (nothing is sent at world size 1).
  void end_sample(bool sampled);
  // Adds the pending iteration's intervals to the sums (waits for its last
  // event on a device).
  void settle();

  struct Sums {
    int64_t samples = 0;
    double backward_compute = 0, backward_comm = 0, exposed_comm = 0;  // seconds
  };
  const Sums& sums() const { return sums_; }

 private:
  struct Events;  // CUDA: the events of one iteration
  double seconds(Mark from, Mark to);

  c10::Device device_;
  std::array<std::chrono::steady_clock::time_point, kMarks> host_{};
  std::array<bool, kMarks> marked_{};
  std::unique_ptr<Events> events_;
  bool pending_ = false;  // an ended, sampled iteration not yet settled
  Sums sums_;
};

}  // namespace ddp::detail
