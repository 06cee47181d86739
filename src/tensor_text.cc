#include "tensor_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ddp::detail {

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: return c10::toString(type);
  }
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{}[{}]", dtype_name(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

std::string describe_tensors(const std::vector<at::Tensor>& tensors) {
  std::string out;
  for (const at::Tensor& t : tensors) {
    if (!out.empty()) out += ' ';
    out += describe_tensor(t);
  }
  return out;
}

}  // namespace ddp::detail
