// ddp-train's output on rank 0: progress (a bar on a terminal, a line every
// --log-every steps otherwise), the per-epoch metrics.jsonl, and the plot.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "ddp/env.h"

namespace ddp::train {

// What one epoch produced; every number already reduced over the ranks.
struct EpochRecord {
  int epoch = 0;             // 1-based
  int64_t steps = 0;         // optimizer steps so far
  double train_loss = 0;     // mean over the epoch's samples
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = 0;  // over every test image exactly once
  int64_t test_images = 0;
  double samples_per_s = 0;  // all ranks' training samples / epoch time
  double epoch_time_s = 0;   // training part of the epoch
  double wall_time_s = 0;    // since the start of the run
  int world_size = 1;
  int64_t global_batch = 0;
};

// Progress within an epoch. `due(step)` is the same on every rank (it
// depends on the step and on rank 0's terminal, shared at construction), so
// the ranks can reduce the shown numbers together.
class Progress {
 public:
  // `first_step`: steps of this epoch already done (a resumed epoch); the
  // ETA is the time per step since construction times the steps left.
  Progress(bool terminal, int log_every, int epoch, int epochs, int64_t steps_in_epoch,
           int64_t first_step = 0);
  bool due(int64_t step_in_epoch) const;
  // Rank 0 only: draw the bar or print the line. `loss` and `accuracy` (a
  // fraction, shown in %) are the means of the last `window` steps, and
  // say so ("last 10 steps: loss ..."): the epoch's line has the epoch's.
  void show(int64_t step_in_epoch, int64_t window, double loss, double accuracy,
            double samples_per_s);
  // Ends the bar's line (terminal only).
  void finish();

 private:
  bool terminal_;
  int log_every_;
  int epoch_, epochs_;
  int64_t steps_;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_ = 0;
};

// Whether rank 0's progress goes to a terminal: its stdout is one, or
// ddprun relays it to one (DDP_TERMINAL=1, LaunchEnv::stdout_reaches_terminal;
// Note [Carriage-return updates]).
bool stdout_reaches_terminal(const LaunchEnv& launch);

// Rank 0, at start-up: "" when `dir` can be created and written (a file is
// created and removed there), else what went wrong, naming `flag` and the
// path, so that a bad directory fails the run at once, not at the first
// checkpoint an epoch later.
std::string directory_problem(const std::string& flag, const std::string& dir);

// Appends one JSON line to `path` (created if needed) and fsyncs it.
// Throws ddp::InvalidArgument naming the file when it cannot be written.
void append_metrics(const std::string& path, const EpochRecord& record);

// Draws loss and accuracy per epoch from metrics.jsonl into `png` with
// gnuplot. Returns false (and says why on stderr) when gnuplot is missing
// or fails; the run does not fail over a plot.
bool plot_metrics(const std::string& jsonl, const std::string& png);

}  // namespace ddp::train
