// GradScalerState's text form, as a checkpoint's metadata keeps it: the
// part of the scaler that parses bytes from disk (fuzz/grad_scaler_state_fuzzer.cc).
#include <fmt/format.h>

#include <set>
#include <sstream>
#include <stdexcept>

#include "ddp/error.h"
#include "ddp/grad_scaler.h"

namespace ddp {

std::string GradScalerState::to_string() const {
  return fmt::format("scale={:.17g} growth_factor={:.17g} backoff_factor={:.17g} "
                     "growth_interval={} growth_tracker={}",
                     scale, growth_factor, backoff_factor, growth_interval, growth_tracker);
}

GradScalerState GradScalerState::from_string(const std::string& text) {
  GradScalerState s;
  std::istringstream in(text);
  std::string field;
  std::set<std::string> seen;
  while (in >> field) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    try {
      size_t used = 0;
      if (key == "scale") s.scale = std::stod(value, &used);
      else if (key == "growth_factor") s.growth_factor = std::stod(value, &used);
      else if (key == "backoff_factor") s.backoff_factor = std::stod(value, &used);
      else if (key == "growth_interval") s.growth_interval = std::stoll(value, &used);
      else if (key == "growth_tracker") s.growth_tracker = std::stoll(value, &used);
      else used = std::string::npos;
      if (used != value.size()) throw std::invalid_argument(key);
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("GradScalerState::from_string: '{}' is not a GradScaler "
                                        "state (at '{}')", text, field));
    }
    if (!seen.insert(key).second) {
      throw InvalidArgument(fmt::format("GradScalerState::from_string: '{}' is not a GradScaler "
                                        "state ('{}' twice)", text, key));
    }
  }
  if (seen.size() != 5) {
    throw InvalidArgument(fmt::format(
        "GradScalerState::from_string: '{}' is not a GradScaler state (5 fields expected)", text));
  }
  return s;
}

}  // namespace ddp
