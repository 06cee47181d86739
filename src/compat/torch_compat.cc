#include "compat/torch_compat.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ddp/error.h"

namespace ddp::compat {

std::string torch_version() { return TORCH_VERSION; }

bool cuda_compiled() {
#ifdef DDP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool nccl_compiled() {
#ifdef DDP_WITH_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                      int rank, int size,
                                      const std::string& address, int threads,
                                      std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (address.rfind("if:", 0) == 0) {
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForInterface(address.substr(3)));
  } else if (address.empty()) {
    // As PyTorch: the host name's address, else the loopback interface.
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  } else {
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(address));
  }
  options->threads = threads;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
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

std::string what_without_backtrace(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    return ce->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ddp::compat
