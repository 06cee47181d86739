// DeviceClock: Note [Device timing] (device_clock.h).
#include "reducer/device_clock.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <vector>

#include "compat/torch_compat.h"

namespace ddp::detail {

struct DeviceClock::Events {
  std::vector<c10::Event> at;  // one per Mark
};

DeviceClock::DeviceClock(c10::Device device) : device_(device) {
  if (!device_.is_cpu()) {
    events_ = std::make_unique<Events>();
    for (int m = 0; m < kMarks; ++m) {
      events_->at.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
    }
  }
}

DeviceClock::~DeviceClock() = default;

void DeviceClock::begin_sample() {
  settle();
  marked_.fill(false);
  mark(kBackwardStart);
}

void DeviceClock::mark(Mark m) {
  marked_[m] = true;
  if (!events_) {
    host_[m] = std::chrono::steady_clock::now();
    return;
  }
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device_.type());
  events_->at[m].record(impl->getStream(device_));
}

bool DeviceClock::marked(Mark m) const { return marked_[m]; }

void DeviceClock::end_sample(bool sampled) {
  mark(kEnd);
  pending_ = sampled;
  if (!events_) settle();  // host readings: nothing to wait for
}

double DeviceClock::seconds(Mark from, Mark to) {
  if (!events_) return std::chrono::duration<double>(host_[to] - host_[from]).count();
  return compat::elapsed_seconds(events_->at[from], events_->at[to]);
}

void DeviceClock::settle() {
  if (!pending_) return;
  pending_ = false;
  ++sums_.samples;
  sums_.backward_compute += seconds(kBackwardStart, kComputeEnd);
  if (marked_[kFirstLaunch]) {
    sums_.backward_comm += seconds(kFirstLaunch, kEnd);
    sums_.exposed_comm += seconds(kComputeEnd, kEnd);
  }
}

}  // namespace ddp::detail
