// Subgroups of a process group: torch.distributed.new_group(ranks).
//
// A subgroup is a ProcessGroup of some of the parent's ranks, for
// collectives among them only (a pipeline stage, the replicas of one shard,
// the ranks of one host). Its ranks are renumbered 0..size-1 in the order of
// the parent's ranks (PyTorch sorts `ranks` too). It meets through the
// parent's store under a prefix of its own: no second rendezvous, no new
// port. It uses the parent's backend, timeout (unless given) and stall
// inspector settings; its collectives go through the backend (Gloo or
// NCCL), not the parent's shared memory (shared_memory_off_reason() says
// so).
//
// Every rank of the parent calls new_group, members or not, in the same
// order and with the same `ranks` (as in PyTorch: the calls are numbered).
// A non-member gets a group whose rank() is -1 (is_member() false): any
// collective on it throws InvalidArgument naming this rank and the group's
// ranks, instead of running on the wrong ranks.
//
// Errors: InvalidArgument for ranks that are empty, repeated or not ranks of
// the parent (on every rank, before anything is exchanged); CommError or
// TimeoutError when the members do not all arrive within the timeout (a
// member that skipped the call, or different `ranks` on different ranks).
//
// Thread safety: call new_group from one thread per rank, as collectives.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

struct NewGroupOptions {
  // The group whose ranks `ranks` are; null: the default group.
  ProcessGroupPtr parent;
  // Bound on each of the subgroup's collectives and on its creation; unset:
  // the parent's.
  std::optional<std::chrono::milliseconds> timeout;
  // In messages: "subgroup 'stage1' (parent ranks 0, 1)"; empty: its number
  // among the parent's new_group calls.
  std::string name;
};

// The subgroup of the parent's `ranks` (see above). Collective.
ProcessGroupPtr new_group(const std::vector<int>& ranks, const NewGroupOptions& options = {});

// torch.distributed.split_group: the parent's ranks split into disjoint
// subgroups at once, one new_group per list of `split_ranks` in order
// (every rank of the parent calls it with the same lists). Returns the
// subgroup this rank is in, or null when no list holds it. options.name, if
// given, names each subgroup "<name>[i]". Throws InvalidArgument, on every
// rank before anything is exchanged, for a rank in two lists (naming it and
// both lists' indices) or a list new_group refuses.
ProcessGroupPtr split_group(const std::vector<std::vector<int>>& split_ranks,
                            const NewGroupOptions& options = {});

// Whether this rank is in `group` (false for a non-member's subgroup).
bool is_member(const ProcessGroup& group);

}  // namespace ddp
