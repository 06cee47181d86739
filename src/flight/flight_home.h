// Where ddp keeps the flight records that no directory was named for
// (docs/flight_recorder.md, "Where the rings go"). No libtorch.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "compat/filesystem_compat.h"

namespace ddp::flight {

// "$XDG_STATE_HOME/ddp/flight" (an absolute XDG_STATE_HOME), else
// "$HOME/.local/state/ddp/flight" (the XDG default), else
// "/tmp/ddp-flight-<uid>": one place per user, never the working directory.
// ddprun copies a failed attempt's rings under it; a program without
// DDP_FLIGHT_RECORDER_DIR writes its in-memory rings there at an event.
inline std::string records_home() {
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && state[0] == '/') return std::string(state) + "/ddp/flight";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.local/state/ddp/flight";
  return "/tmp/ddp-flight-" + std::to_string(::getuid());
}

// How many record directories records_home() keeps: each holds one failed
// attempt's or one process's rings, and nobody else cleans them up.
inline constexpr std::size_t kKeptRecordDirs = 50;

// Removes the oldest directories of records_home() (by modification time)
// beyond the newest `keep`; the one just written is the newest. Best effort,
// never throws: a directory another user's process holds stays.
inline void prune_records_home(std::size_t keep = kKeptRecordDirs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> dirs;
  for (fs::directory_iterator it(records_home(), ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec) || ec) continue;
    const fs::file_time_type when = fs::last_write_time(it->path(), ec);
    if (!ec) dirs.emplace_back(when, it->path());
  }
  if (dirs.size() <= keep) return;
  std::sort(dirs.begin(), dirs.end());  // oldest first
  // Not fs::remove_all: Note [remove_all and libtorch 2.11].
  for (std::size_t i = 0; i + keep < dirs.size(); ++i) compat::remove_tree(dirs[i].second, ec);
}

}  // namespace ddp::flight
