// Where ddp keeps the flight records that no directory was named for
// (docs/flight_recorder.md, "Where the rings go"). No libtorch.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

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

}  // namespace ddp::flight
