// send, recv, isend, irecv, batch_isend_irecv (point_to_point.h).
//
// Note [Point-to-point numbering]
// The group's collectives are numbered (WorkImpl::seq) and every rank must
// reach every number: the stall inspector reports the ranks that have not
// reached one, debug mode compares fingerprints under it, the flight
// recorder's verdict lines the ranks up by it. A send involves two ranks
// only; counted there, it would put the other ranks' numbers out of step.
// So sends and receives draw from a counter of their own (next_p2p_seq,
// used in messages only) and skip the inspector, the checks and the flight
// record; a stuck one ends at its timeout, naming the peer. (PyTorch's NCCL
// group also numbers them apart: its P2P sequence numbers.)
#include "ddp/point_to_point.h"

#include <fmt/format.h>

#include "collective_args.h"
#include "ddp/error.h"
#include "work.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;

void check_peer(int peer, const char* op, const char* name, const CollectiveOptions& options,
                bool any_allowed) {
  const ProcessGroup& g = detail::resolve_group(options);
  if (any_allowed && peer == kAnySource) return;
  if (peer < 0 || peer >= g.size()) {
    throw InvalidArgument(fmt::format("{}: {}={} is not a rank of the group (size {})", op, name,
                                      peer, g.size()));
  }
  if (peer == g.rank()) {
    throw InvalidArgument(fmt::format("{}: {}={} is this rank itself; copy the tensor instead",
                                      op, name, peer));
  }
}

std::shared_ptr<detail::WorkImpl> start_send(const at::Tensor& tensor, int dst, int tag,
                                             const CollectiveOptions& options) {
  detail::check_tensor(tensor, "send", "tensor", options);
  check_peer(dst, "send", "dst", options, false);
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  std::vector<at::Tensor> tensors{detail::on_group_device(group, tensor)};
  return detail::start_point_to_point(
      options, fmt::format("send to rank {} (tag {})", dst, tag),
      [&](compat::Backend& b, milliseconds) { return b.send(tensors, dst, tag); });
}

std::shared_ptr<detail::WorkImpl> start_recv(at::Tensor& tensor, int src, int tag,
                                             const CollectiveOptions& options) {
  detail::check_tensor(tensor, "recv", "tensor", options);
  check_peer(src, "recv", "src", options, true);
  detail::ProcessGroupImpl& group = detail::resolve_group(options).impl();
  std::vector<at::Tensor> tensors{detail::on_group_device(group, tensor)};
  const std::string from = src == kAnySource ? "any rank" : fmt::format("rank {}", src);
  auto w = detail::start_point_to_point(
      options, fmt::format("recv from {} (tag {})", from, tag),
      [&](compat::Backend& b, milliseconds) {
        return src == kAnySource ? b.recvAnysource(tensors, tag) : b.recv(tensors, src, tag);
      });
  if (detail::staged(group, tensor)) {
    at::Tensor out = tensor, result = tensors[0];
    w->then = [out, result]() mutable { out.copy_(result); };
    w->then_on_host = true;
  }
  return w;
}

}  // namespace

void send(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options) {
  Work(start_send(tensor, dst, tag, options)).wait();
}

int recv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options) {
  auto w = start_recv(tensor, src, tag, options);
  Work(w).wait();
  return src == kAnySource && w->work ? w->work->sourceRank() : src;
}

Work isend(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options) {
  return Work(start_send(tensor, dst, tag, options));
}

Work irecv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options) {
  if (src == kAnySource) {
    throw InvalidArgument("irecv: src must be a rank (kAnySource is for recv)");
  }
  return Work(start_recv(tensor, src, tag, options));
}

std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops,
                                    const CollectiveOptions& options) {
  std::vector<Work> works;
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Kind::kSend) {
      works.push_back(isend(op.tensor, op.peer, op.tag, options));
    } else {
      at::Tensor t = op.tensor;
      works.push_back(irecv(t, op.peer, op.tag, options));
    }
  }
  return works;
}

}  // namespace ddp
