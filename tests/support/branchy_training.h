// Branchy (support/models.h) trained with SGD on thread ranks under
// DistributedDataParallel, as a TrainRun says: the harness of the comm hook
// tests (comm_hooks_test.cc) and of PowerSGD's (powersgd_test.cc), which
// register their hook in TrainRun::setup and compare the final states.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/join.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/thread_world.h"

namespace ddp::testing {

struct TrainRun {
  int world = 2;
  int steps = 3;
  int accumulate = 1;            // micro-steps per step, the first under no_sync
  std::vector<int> rank_steps;   // non-empty: uneven steps under join
  DistributedDataParallelOptions options;
  // Called on each rank's wrapper before training (register a hook here).
  std::function<void(DistributedDataParallel<Branchy>&, int rank)> setup;
  bool aux_on_rank1 = false;     // Branchy's aux head used by rank 1 only (else by all)
};

// A batch of 4 rows: deterministic per (step, rank), and safe on rank
// threads (own generator).
inline at::Tensor data(int step, int rank, int64_t cols) {
  constexpr int kBatch = 4;
  at::Generator gen = at::detail::createCPUGenerator(1000 + 31 * step + rank);
  return torch::randn({kBatch, cols}, gen);
}

// Trains Branchy from one seed on run.world thread ranks with SGD; returns
// every rank's final state.
inline std::vector<NamedState> train(const TrainRun& run) {
  torch::manual_seed(3);
  Branchy init;
  std::vector<Branchy> models(run.world);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(run.world);
  run_ranks(run.world, [&](int r) {
    DistributedDataParallel<Branchy> model(models[r], run.options);
    if (run.setup) run.setup(model, r);
    torch::optim::SGD opt(model.parameters(), 0.1);
    auto step = [&](int s) {
      opt.zero_grad();
      for (int k = 0; k < run.accumulate; ++k) {
        auto out = model(data(s * run.accumulate + k, r, 8), !run.aux_on_rank1 || r == 1);
        auto loss = torch::mse_loss(out, data(s * run.accumulate + k, r + 100, 4));
        if (k + 1 < run.accumulate) {
          auto guard = model.no_sync();
          loss.backward();
        } else {
          loss.backward();
        }
      }
      opt.step();
    };
    if (run.rank_steps.empty()) {
      for (int s = 0; s < run.steps; ++s) step(s);
    } else {
      join(model, [&] { for (int s = 0; s < run.rank_steps[r]; ++s) step(s); });
    }
    states[r] = state_of(models[r]);
  });
  return states;
}

}  // namespace ddp::testing
