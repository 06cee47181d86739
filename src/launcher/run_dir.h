// ddprun's run directory: where the attempts' error files (and, when the
// user asks, log files) go, and the FileStore of --standalone. One per run,
// created private (mkdtemp: mode 0700) under --log-dir or $TMPDIR (/tmp).
//
// A temporary one (no --log-dir, no -r/-t) is removed when ddprun exits. A
// ddprun killed with SIGKILL cannot remove it, so each temporary directory
// carries an owner file (the launcher's pid and its start time), and the
// next ddprun of the same user removes those whose owner is gone: see
// remove_stale_run_dirs. Kept directories (logs) are never removed.
#pragma once

#include <string>

#include "launcher/options.h"

namespace ddp::launcher {

class RunDir {
 public:
  // Creates the directory; throws ddp::InvalidArgument naming the parent
  // (and --log-dir or TMPDIR) when it cannot.
  explicit RunDir(const LaunchOptions& o);
  ~RunDir();  // removes a temporary directory with everything in it
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::string& path() const { return path_; }
  bool kept() const { return keep_; }  // false: removed when ddprun exits
  // Keeps a temporary directory after all (the flight records could not be
  // copied out of it): no longer removed, by this ddprun or a later one.
  void keep();
  std::string attempt_dir(int restart_count) const;

 private:
  std::string path_;
  bool keep_ = false;
};

// Removes, under `base`, the temporary run directories ("ddprun_*") of this
// user whose owner file names a process that is gone (or a pid now held by
// another process: the start times differ). Best effort: never throws.
// Returns how many it removed.
int remove_stale_run_dirs(const std::string& base);

}  // namespace ddp::launcher
