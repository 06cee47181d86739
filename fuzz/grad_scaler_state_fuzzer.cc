// libFuzzer target: GradScalerState::from_string, the parser of the scaler
// state that ddp-train's checkpoints keep in their metadata ("grad_scaler")
// and that any program may read back from a checkpoint on disk.
//
// Contract checked on every input: the text is either refused with
// ddp::InvalidArgument, or parsed into a state whose to_string() parses
// back to the very same state (every field, the doubles bit for bit, NaN
// included): what --resume reads is what the run wrote.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ddp/error.h"
#include "ddp/grad_scaler.h"

namespace {

[[noreturn]] void violated(const char* what, const std::string& text) {
  std::fprintf(stderr, "grad_scaler_state_fuzzer: contract violated: %s (input '%s')\n", what,
               text.c_str());
  std::abort();
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ddp::GradScalerState s;
  try {
    s = ddp::GradScalerState::from_string(text);
  } catch (const ddp::InvalidArgument&) {
    return 0;
  }
  ddp::GradScalerState back;
  try {
    back = ddp::GradScalerState::from_string(s.to_string());
  } catch (const ddp::InvalidArgument&) {
    violated("to_string() of a parsed state does not parse", text);
  }
  // NaN's sign and payload do not survive "%.17g" / strtod: any NaN is NaN.
  auto same = [](double a, double b) { return same_bits(a, b) || (a != a && b != b); };
  if (!same(back.scale, s.scale) || !same(back.growth_factor, s.growth_factor) ||
      !same(back.backoff_factor, s.backoff_factor) ||
      back.growth_interval != s.growth_interval || back.growth_tracker != s.growth_tracker) {
    violated("the state does not survive to_string() and from_string()", text);
  }
  return 0;
}
