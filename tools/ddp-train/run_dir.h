// ddp-train's output directory as one run's: refused when it holds
// another run, resumed only with the flags of the run it holds.
//
// Note [One run per directory]
// A second run into an --out-dir would append to the first's metrics.jsonl
// and mix checkpoints (keep_last would delete the new run's, --resume pick
// the old run's). So rank 0 looks at the directory before training: a
// directory with metrics.jsonl or checkpoints is refused, unless the user
// says --resume (continue it) or --overwrite (replace it: ddp-train's own
// files go, nothing else; checkpoints in a --checkpoint-dir of their own
// beside an --out-dir without metrics are another run's, and not removed).
// A resume compares the checkpoint's recorded configuration (config_record,
// in its metadata "config") with the flags and names every difference that
// would make the continued run another run (seed, samples, batch, model,
// optimizer, schedule, learning rate, --scale-lr, augmentation, label
// smoothing, --amp, and epochs when either run's schedule is one-cycle; keys
// an older ddp-train did not record count as the values its runs had);
// a changed world size is allowed (the checkpoint resumes on any number of
// ranks) and said, with the global batch it gives. metrics.jsonl is then
// cut back to the checkpoint's step, so that a crash between an epoch's line
// and its checkpoint never leaves the line twice; and an epoch's line is
// taken back when its checkpoint fails (metrics_mark / metrics_rollback).
// Every decision is rank 0's, broadcast, so that all ranks fail alike.
#pragma once

#include <cstdint>
#include <string>

#include "config.h"
#include "ddp/checkpoint.h"

namespace ddp::train {

// Collective. Throws InvalidArgument on every rank when --out-dir (or
// --checkpoint-dir) holds another run and neither --resume nor --overwrite
// was given; with --overwrite rank 0 removes that run's files first.
void claim_run_dir(const TrainConfig& config, int rank);

// The run's identity as JSON, for the checkpoint's metadata "config".
std::string config_record(const TrainConfig& config, int world_size);

// Throws InvalidArgument naming every flag that differs from the run the
// checkpoint belongs to ("--seed 1, but the checkpoint's run used 0");
// returns a note for what may differ ("" when nothing): a world size, and
// with it the global batch. A checkpoint without a record is not checked
// (the note says so).
std::string check_resume(const Checkpoint& ckpt, const TrainConfig& config, int world_size);

// The world size the checkpoint's run recorded (its "config" metadata);
// `otherwise` when it recorded none. Call after check_resume, which refuses
// a damaged record.
int recorded_world_size(const Checkpoint& ckpt, int otherwise);

// Rank 0: keeps the lines of metrics.jsonl of the checkpoint's past: its
// complete epochs (1-based "epoch" <= `epochs_done`, the checkpoint's
// epoch) up to its step ("steps" <= `step`), dropping the rest (a line of
// the epoch a --max-steps or interrupted run stopped inside is written
// again, whole, when the resumed run finishes that epoch). Returns the
// number dropped.
int cut_metrics(const std::string& jsonl, int64_t step, int64_t epochs_done);

// The size of metrics.jsonl before an epoch's line is appended, and the
// taking back of that line when the epoch's checkpoint then fails.
int64_t metrics_mark(const std::string& jsonl);
void metrics_rollback(const std::string& jsonl, int64_t mark);

}  // namespace ddp::train
