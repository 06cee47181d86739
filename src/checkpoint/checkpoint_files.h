// Internal: checkpoint files in a directory: names, atomic writes, listing,
// pruning. Every function throws InvalidArgument naming the path and the
// system's error text on failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

inline constexpr const char* kCheckpointPrefix = "checkpoint-epoch";
inline constexpr const char* kCheckpointSuffix = ".ddpckpt";
inline constexpr const char* kModelSuffix = ".model.pt";

// "checkpoint-epoch000003-step000000001200" (epoch, step >= 0).
std::string checkpoint_stem(int64_t epoch, int64_t step);

struct ListedCheckpoint {
  int64_t epoch = 0;
  int64_t step = 0;
  std::string stem;
};
// The complete checkpoints (.ddpckpt files with a well-formed name) in
// `dir`, sorted by (epoch, step) ascending. Empty when `dir` does not exist.
std::vector<ListedCheckpoint> list_checkpoints(const std::string& dir);

// Creates `dir` and its parents when missing.
void ensure_directory(const std::string& dir);

// Writes `size` bytes to dir/name via a temporary file in `dir`: write,
// fsync, rename over dir/name, fsync `dir`. On failure the temporary file is
// removed and the previous dir/name (if any) is unchanged.
void write_file_atomically(const std::string& dir, const std::string& name,
                           const char* data, size_t size);

// Whole content of a file.
std::string read_whole_file(const std::string& path);

// Removes what a writer that crashed left: temporaries (".checkpoint-*.tmp.*")
// and model files without their checkpoint.
void remove_stale_temporaries(const std::string& dir);

// Keeps the newest `keep_last` checkpoints (all when 0), removing older ones
// with their model files.
void prune_checkpoints(const std::string& dir, int keep_last);

}  // namespace detail
}  // namespace ddp
