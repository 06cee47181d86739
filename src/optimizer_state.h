// Internal: ddp::OptimizerState (ddp/optimizer_state.h) taken from and put
// back into a torch::optim optimizer, and its byte layout. Below both
// checkpoints and ZeroRedundancyOptimizer: neither includes the other.
#pragma once

#include <string>

#include "byte_codec.h"
#include "ddp/optimizer_state.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp::detail {

// The optimizer's whole state. A ShardedOptimizer gives its consolidated
// state (throws where it has none, see ShardedOptimizer::state_dict).
OptimizerState capture_optimizer(const torch::optim::Optimizer& optimizer);
// Validates against `optimizer` first, then applies (a ShardedOptimizer
// takes its shard); `source` names the checkpoint in errors.
void restore_optimizer(const OptimizerState& s, torch::optim::Optimizer& optimizer,
                       const std::string& source);

// The byte layout (optimizer_state_codec.cc).
void write_fields(ByteWriter& w, const OptimizerFields& fields);
OptimizerFields read_fields(ByteReader& r, const c10::Device& device);
void write_optimizer(ByteWriter& w, const OptimizerState& s);
OptimizerState read_optimizer(ByteReader& r, const c10::Device& device);

}  // namespace ddp::detail
