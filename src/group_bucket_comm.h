// Internal: the reducer's BucketComms (reducer/bucket_comm.h) over a ddp
// ProcessGroup: the communication side of Note [Bucket communication],
// outside the reducer's wing because it starts operations through the
// group's internals (work.h: labels, flight records, shared memory).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"
#include "reducer/bucket_comm.h"

namespace ddp::detail {

struct BucketCommContext {
  ProcessGroupPtr group;
  std::optional<std::chrono::milliseconds> timeout;  // default: the group's
};

// The default: one all_reduce per bucket over [grads | flags], buckets in
// the group's shared memory where it has some.
std::unique_ptr<BucketComm> make_fused_all_reduce(BucketCommContext context);
// A user's comm hook per bucket, then one all_reduce of every bucket's
// flags. InvalidArgument for an empty hook.
std::unique_ptr<BucketComm> make_hook_comm(BucketCommContext context, CommHook hook,
                                           std::string name);

}  // namespace ddp::detail
