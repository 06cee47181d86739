// Internal: the text of a log level (DDP_LOG_LEVEL) read back (logging.cc).
#pragma once

#include <string>

#include "ddp/logging.h"

namespace ddp::detail {

// Parses "debug", "info", "warning" (or "warn"), "error", "off"
// (case-insensitive), or Python's numeric values "10".."40". `what` names the
// source in the error (a flag, an environment variable).
// Throws InvalidArgument naming `what`, the value, and the accepted values.
LogLevel parse_log_level(const std::string& text, const std::string& what = "log level");

}  // namespace ddp::detail
