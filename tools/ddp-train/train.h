// ddp-train's training run: what main() calls once the flags are parsed.
#pragma once

#include "config.h"

namespace ddp::train {

// Joins the process group (env://), trains and evaluates, writes metrics,
// checkpoints and the plot, and leaves the group. Returns the process's
// exit code. Throws ddp::Error for bad input and failed collectives.
int run(const TrainConfig& config);

}  // namespace ddp::train
