// compat::make_gloo: the only translation unit that includes c10d's
// ProcessGroupGloo.hpp, and so the only one that sees Gloo's headers.
//
// Note [Gloo headers]
// ~~~~~~~~~~~~~~~~~~~
// ProcessGroupGloo.hpp includes Gloo's headers (gloo/algorithm.h, ...).
// Debian's libtorch-dev comes with the matching libgloo-dev; PyTorch's wheels
// and LibTorch archives link Gloo into libtorch_cpu but ship none of its
// headers. Compiling against another Gloo's headers is safe here because
// nothing this file compiles depends on the layout of any Gloo type:
//
//  - Every Gloo type in ProcessGroupGloo and its Options is held through
//    std::shared_ptr / std::unique_ptr (devices, contexts, store), so the
//    size and member offsets of the classes we allocate and write
//    (ProcessGroupGloo via make_intrusive, Options::devices and ::threads)
//    are fixed by the C++ standard library and c10, not by Gloo.
//  - The functions we call are compiled inside libtorch against its own Gloo:
//    Options' constructor, createDeviceFor{Interface,Hostname},
//    createDefaultDevice, ProcessGroupGloo's constructor and destructor.
//    ProcessGroupGloo's vtable is emitted with its key function (the
//    out-of-line destructor) in libtorch, not here.
//  - Inline members that do touch Gloo objects (GlooStore's overrides,
//    setTimeout's loop over contexts) are never odr-used here, so none of
//    their code or vtables is emitted into libddp.
//
// The Gloo headers therefore only have to declare the names, and
// GlooStore's base class must have the virtuals it overrides (any Gloo
// since 2019 has them). The test gloo_backend_abi (tests/compat/) checks the
// object file of this translation unit: every symbol it defines or uses that
// mentions gloo is a standard-library smart-pointer or container operation
// or a libtorch function, never a member of a Gloo class. Keep this file
// that small: no other c10d or Gloo calls belong here.

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "compat/torch_compat.h"

namespace ddp::compat {

c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                      int rank, int size,
                                      const std::string& address, int threads,
                                      std::chrono::milliseconds timeout) {
  auto options = c10::make_intrusive<c10d::ProcessGroupGloo::Options>(timeout);
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

}  // namespace ddp::compat
