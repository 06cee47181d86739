#include "call_scope.h"

namespace ddp::detail {
namespace {

thread_local const char* t_name = nullptr;
thread_local const char* t_advice = nullptr;

}  // namespace

CallScope::CallScope(const char* name, const char* advice)
    : previous_name_(t_name), previous_advice_(t_advice) {
  t_name = name;
  if (advice) t_advice = advice;  // an inner call without its own keeps the outer's
}

CallScope::~CallScope() {
  t_name = previous_name_;
  t_advice = previous_advice_;
}

const char* current_call() { return t_name; }
const char* current_call_advice() { return t_advice; }

}  // namespace ddp::detail
