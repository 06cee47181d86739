// The one place that knows which libtorch ddp is built against.
//
// libtorch 1.13 (Debian 12) and 2.x differ in c10d's class layout: in 1.13
// ProcessGroupGloo/ProcessGroupNCCL derive from c10d::ProcessGroup; from 2.0
// they derive from c10d::Backend, and a c10d::ProcessGroup dispatches to
// backends per device type. ddp drives the backend object directly in both
// cases: both classes expose the same virtual collectives (allreduce,
// broadcast, allgather, gather, scatter, reduce, barrier) taking the same
// option structs and returning c10::intrusive_ptr<c10d::Work>.
// Everything version-dependent goes here; no other file tests
// TORCH_VERSION_*.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#include <c10/core/Event.h>

#include <chrono>
#include <string>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace ddp::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

// "1.13.1" etc., for messages and benchmark records.
std::string torch_version();

// Whether this libtorch was built with CUDA / with c10d's NCCL backend.
bool cuda_compiled();
bool nccl_compiled();

// Whether this libtorch's Gloo backend reduces bfloat16 tensors (PyTorch
// 2.x; 1.13's raises "Invalid scalar type").
bool gloo_reduces_bfloat16();

// A Gloo backend bound to `address` (an IP address or host name of this
// machine, "if:<name>" for a network interface, or "" for PyTorch's default
// device: the host name's address, else loopback), with `threads` worker
// threads and `timeout` on every operation.
c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                      int rank, int size,
                                      const std::string& address, int threads,
                                      std::chrono::milliseconds timeout);

// A NCCL backend; throws ddp::CommError naming the missing support when this
// libtorch has no NCCL. `timeout` is ddp's, which the host enforces (Note
// [Device waits]); NCCL's watchdog gets it plus a margin (10 %, at least
// 10 s), so that ddp's error, naming the ranks, comes first and the
// watchdog stays the backstop for work nobody waits for.
// `device`: the rank's GPU, bound to the backend (its barrier and
// communicator use it; 2.x).
c10::intrusive_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                      int rank, int size,
                                      std::chrono::milliseconds timeout, c10::Device device);
// NCCL's watchdog timeout for ddp's `timeout` (see make_nccl).
std::chrono::milliseconds nccl_watchdog_timeout(std::chrono::milliseconds timeout);

// Aborts a backend's communicators (ProcessGroupNCCL::abort: kernels stuck
// in a collective end). Best effort: errors are swallowed; a no-op where
// this libtorch's backend has no abort (1.13).
void abort_backend(Backend& backend) noexcept;

// Waits, at most `limit`, for the work queued so far on `device`'s current
// stream (an event recorded there completes), so that an abort does not cut
// off a collective its users waited for on the stream only (Note [Device
// waits]). Returns whether it completed. Never throws; true at once where
// this libtorch cannot (1.13).
bool drain_device(const c10::Device& device, std::chrono::milliseconds limit) noexcept;

// A c10d::TCPStore (client or server, as `options` say) on host:options.port,
// or null when its constructor has not returned within `limit`. c10d 2.x's
// client constructor pings the server with an unbounded read, so a port
// whose owner accepts connections but never answers (another program, a
// stopped store host) would block it forever; 1.13's returns once
// connected. The constructor runs on a helper thread, which is left to
// finish or block on its own when the limit passes (its store is then
// destroyed with it). Exceptions of the constructor are rethrown.
c10::intrusive_ptr<c10d::Store> connect_tcp_store(const std::string& host,
                                                  const c10d::TCPStoreOptions& options,
                                                  std::chrono::milliseconds limit);

// Seconds between two recorded device events (c10::Event with timing);
// waits for `end` to complete. libtorch 1.13's c10::Event cannot time (and
// Debian's has no device anyway): it throws there.
double elapsed_seconds(const c10::Event& start, const c10::Event& end);

// The text of an exception thrown by libtorch, without c10's backtrace.
std::string what_without_backtrace(const std::exception& e);

}  // namespace ddp::compat
