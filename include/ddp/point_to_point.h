// Point-to-point communication: send, recv, isend, irecv and
// batch_isend_irecv, as torch.distributed's.
//
// A send on rank i to rank j pairs with a receive on rank j from rank i
// with the same tag (0 by default); pairs between the same two ranks and tag
// match in the order they were started. The receiving tensor must have the
// sender's number of elements and dtype (the backend moves bytes: a
// mismatch is the caller's error, as in PyTorch; Gloo reports a size
// mismatch as a CommError). Tensors must be contiguous; Gloo takes CPU
// tensors, NCCL CUDA tensors on the rank's device (CPU tensors are staged
// through it, Note [Staging on NCCL]). Ranks are ranks of the group
// (CollectiveOptions::group; the default group when unset), never this rank
// itself.
//
// Only the two ranks take part: sends and receives are not numbered among
// the group's collectives, so they have no stall reports, debug-mode checks
// or flight records (Note [Point-to-point numbering] in point_to_point.cc);
// each is bounded by its timeout, after which TimeoutError names the peer.
//
// Thread safety: see process_group.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/collectives.h"

namespace ddp {

// recv's `src` for "any rank": the rank that sent is returned.
inline constexpr int kAnySource = -1;

// Sends `tensor` to rank `dst`; returns once the backend has taken it (Gloo:
// sent; the receiver may not have it yet).
void send(const at::Tensor& tensor, int dst, int tag = 0, const CollectiveOptions& options = {});
// Receives into `tensor` from rank `src` (or kAnySource); returns the rank
// that sent it.
int recv(at::Tensor& tensor, int src = kAnySource, int tag = 0,
         const CollectiveOptions& options = {});

// The same, started: wait() on the handle. The tensor must stay alive and
// untouched until then. irecv from kAnySource is not offered (PyTorch's
// irecv needs a source rank on NCCL).
Work isend(const at::Tensor& tensor, int dst, int tag = 0, const CollectiveOptions& options = {});
Work irecv(at::Tensor& tensor, int src, int tag = 0, const CollectiveOptions& options = {});

// One operation of batch_isend_irecv (torch.distributed.P2POp).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor tensor;  // sent from, or received into
  int peer = 0;       // dst of a send, src of a receive
  int tag = 0;
};

// Starts every operation of `ops`, in order, and returns their handles in
// the same order. All of them start before any is waited for, so a rank may
// send to and receive from the same peers in one batch (a ring exchange)
// on Gloo. On NCCL the operations are started one by one, not as one NCCL
// group: order the sends and receives of each pair of ranks the same way on
// both (e.g. the lower rank sends first).
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops,
                                    const CollectiveOptions& options = {});

}  // namespace ddp
