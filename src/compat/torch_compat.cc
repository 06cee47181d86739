#include "compat/torch_compat.h"

#include <c10/util/Exception.h>

#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ddp/error.h"

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
                                      std::chrono::milliseconds timeout) {
#ifdef DDP_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw CommError(
      "backend 'nccl' is not available: this libtorch (" + torch_version() +
      ") was built without CUDA/NCCL support. Use backend 'gloo', or build "
      "ddp against a CUDA libtorch (cmake -DDDP_WITH_NCCL=ON).");
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

std::string what_without_backtrace(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    return ce->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ddp::compat
