// Printing and logging for multi-rank programs: rank 0 only, or every rank
// with a "[rank<N>]: " prefix.
//
// Under a launcher every rank shares the terminal, so an unguarded print
// appears world_size times. The helpers here follow the convention of
// PyTorch programs (`if dist.get_rank() == 0: print(...)`) and of torchrun's
// per-rank line prefix ("[rank1]: ...").
//
//   ddp::print0("epoch 3: loss 0.2310");                 // stdout, rank 0
//   ddp::print0f("epoch %d: loss %.4f", epoch, loss);    // printf style
//   ddp::log(ddp::LogLevel::kWarning, "shard is empty");  // stderr, this rank
//   ddp::log0(ddp::LogLevel::kInfo, "resumed at epoch 4"); // stderr, rank 0
//
// The public functions take finished text: format with fmt::format,
// std::ostringstream, or the printf-style *f variants; fmt does not appear in
// this header.
//
// Rank: the calling thread's default group (process_group.h); without a
// process group (before init_process_group, or after its destruction) the
// launch environment's rank (env.h: RANK, SLURM_PROCID, ...; 0 when there is
// none, or it is malformed), so a process started with RANK=1 never speaks
// as rank 0, and the helpers work unchanged in a single-process program.
//
// Output: every call writes whole lines. A line is written with a single
// write(2) after flushing the C stdio buffer of that stream, under a
// process-wide mutex, so lines from several threads never interleave, and
// lines from several processes sharing a pipe or file do not interleave as
// long as each is under PIPE_BUF (4096 bytes on Linux). Text with several
// lines is prefixed on every line. A missing trailing newline is added.
//
// Thread safety: every function may be called from any thread.
// Errors: write errors (a closed stdout, a full disk) are ignored: losing a
// log line is better than failing a training job over it.
#pragma once

#include <string>

namespace ddp {

// Severity, as Python's logging levels. kOff disables log() and log0().
enum class LogLevel { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40, kOff = 100 };

// "DEBUG", "INFO", "WARNING", "ERROR", "OFF".
const char* to_string(LogLevel level);

// The threshold: log() and log0() drop messages below it. Starts as
// DDP_LOG_LEVEL when that is set and valid, else kInfo. An invalid
// DDP_LOG_LEVEL is reported once on stderr ("ddp: DDP_LOG_LEVEL='x' is not a
// log level: ...; using info") and ignored, rather than throwing from a log call.
LogLevel log_level();
// Sets the threshold for the whole process (overrides DDP_LOG_LEVEL).
void set_log_level(LogLevel level);
// Whether a message at `level` would be written (to skip costly formatting).
bool log_enabled(LogLevel level);

// Rank 0 prints `text` to stdout; other ranks do nothing. Not filtered by
// the log level (it is program output, as print() in Python).
void print0(const std::string& text);
// printf-style print0.
void print0f(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Every calling rank prints `text` to stdout, each line prefixed with
// "[rank<N>]: ". Without a process group the prefix is "[rank0]: ".
void print_all(const std::string& text);

// Writes "[rank<N>]: <LEVEL>: <message>" to stderr when `level` passes the
// threshold, on the calling rank. The "[rank<N>]: " prefix (also that of
// print_all) is left out when DDP_LOG_RANK_PREFIX=0, which ddprun sets for
// workers whose lines it prefixes itself; the variable is read once, at the
// first line that could carry the prefix.
void log(LogLevel level, const std::string& message);
void logf(LogLevel level, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

// As log(), on rank 0 only; the line carries no rank prefix
// ("<LEVEL>: <message>"), since it speaks for the whole job.
void log0(LogLevel level, const std::string& message);
void log0f(LogLevel level, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace ddp
