// ddp-train's output on rank 0: progress (a bar on a terminal, a line every
// --log-every steps otherwise), the per-epoch metrics.jsonl, and the plot.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

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
  Progress(bool terminal, int log_every, int epoch, int epochs, int64_t steps_in_epoch);
  bool due(int64_t step_in_epoch) const;
  // Rank 0 only: draw the bar or print the line.
  void show(int64_t step_in_epoch, double loss, double accuracy, double samples_per_s);
  // Ends the bar's line (terminal only).
  void finish();

 private:
  bool terminal_;
  int log_every_;
  int epoch_, epochs_;
  int64_t steps_;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_ = -1;
};

// Appends one JSON line to `path` (created if needed) and fsyncs it.
// Throws ddp::InvalidArgument naming the file when it cannot be written.
void append_metrics(const std::string& path, const EpochRecord& record);

// Draws loss and accuracy per epoch from metrics.jsonl into `png` with
// gnuplot. Returns false (and says why on stderr) when gnuplot is missing
// or fails; the run does not fail over a plot.
bool plot_metrics(const std::string& jsonl, const std::string& png);

}  // namespace ddp::train
