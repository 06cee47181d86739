#include "compat/torch_compat.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ddp/error.h"

#include <algorithm>
#include <future>
#include <memory>
#include <thread>

namespace ddp::compat {

std::string torch_version() { return TORCH_VERSION; }

bool cuda_compiled() {
#ifdef DDP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool gloo_reduces_bfloat16() { return TORCH_VERSION_MAJOR >= 2; }

bool nccl_compiled() {
#ifdef DDP_WITH_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                      int rank, int size,
                                      std::chrono::milliseconds timeout, c10::Device device) {
#ifdef DDP_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = nccl_watchdog_timeout(timeout);
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  backend->setBoundDeviceId(device);
#endif
  return backend;
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device;
  throw CommError(
      "backend 'nccl' is not available: this libtorch (" + torch_version() +
      ") was built without CUDA/NCCL support. Use backend 'gloo', or build "
      "ddp against a CUDA libtorch (cmake -DDDP_WITH_NCCL=ON).");
#endif
}

std::chrono::milliseconds nccl_watchdog_timeout(std::chrono::milliseconds timeout) {
  return timeout + std::max<std::chrono::milliseconds>(timeout / 10, std::chrono::seconds(10));
}

void abort_backend(Backend& backend) noexcept {
#if TORCH_VERSION_MAJOR >= 2
  try {
    backend.abort();
  } catch (...) {
  }
#else
  (void)backend;
#endif
}

bool drain_device(const c10::Device& device, std::chrono::milliseconds limit) noexcept {
#if TORCH_VERSION_MAJOR >= 2
  try {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    c10::Event done(device.type());
    done.record(impl->getStream(device));
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done.query()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  } catch (...) {
    return false;
  }
#else
  (void)device, (void)limit;
  return true;
#endif
}

c10::intrusive_ptr<c10d::Store> connect_tcp_store(const std::string& host,
                                                  const c10d::TCPStoreOptions& options,
                                                  std::chrono::milliseconds limit) {
  using Result = c10::intrusive_ptr<c10d::Store>;
  auto promise = std::make_shared<std::promise<Result>>();
  std::future<Result> result = promise->get_future();
  std::thread([promise, host, options] {
    try {
      promise->set_value(c10::make_intrusive<c10d::TCPStore>(host, options));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(limit) != std::future_status::ready) return {};
  return result.get();
}

double elapsed_seconds(const c10::Event& start, const c10::Event& end) {
#if TORCH_VERSION_MAJOR >= 2
  end.synchronize();
  return start.elapsedTime(end) / 1000.0;  // c10 reports milliseconds
#else
  (void)start, (void)end;
  throw std::logic_error("device event timing needs libtorch 2.x");
#endif
}

std::string what_without_backtrace(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    return ce->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ddp::compat
