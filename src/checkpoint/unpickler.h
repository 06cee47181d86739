// A restricted unpickler: the part of Python's pickle protocols 2 to 5 that
// torch.save writes for a state dict (dicts, lists, tuples, strings, numbers,
// globals called through REDUCE, persistent ids for storages). It never
// imports or calls anything itself: every global is handed to the caller's
// `reduce` hook, which builds the value or refuses it by name, as Python's
// torch.load(weights_only=True) allows only an allow-list.
//
// Why not libtorch's own: torch::jit::Unpickler reads OrderedDict as None
// (TorchScript only meets it as a tensor's empty backward hooks), so every
// torch.save(model.state_dict()) fails on its first SETITEMS.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::detail::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// One unpickled object. Memoised objects are shared, as in Python (a dict
// put in the memo and fetched twice is one dict).
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal,
                    kTensor };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;  // kInt (LONG1 beyond 64 bits is refused); kBool as 0/1 too
  double real = 0;
  std::string text;  // kString, kBytes; kGlobal: "module.name"
  std::vector<ValuePtr> items;  // kTuple, kList
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // kDict, in insertion order
  at::Tensor tensor;  // kTensor (storages are tensors too: 1-D, their whole storage)
  int depth = 1;  // nesting, bounded so that destruction cannot exhaust the stack
  bool frozen = false;  // inside another container: never changed again
};

ValuePtr make(Value::Kind kind);

struct Hooks {
  // BINPERSID with the persistent id popped from the stack.
  std::function<ValuePtr(const Value& pid)> persistent_load;
  // REDUCE (and NEWOBJ) of the global `name` ("collections.OrderedDict")
  // with its argument tuple. Throws to refuse.
  std::function<ValuePtr(const std::string& name, const Value& args)> reduce;
};

// Runs the pickle program in `bytes` to its STOP and returns the result.
// Throws InvalidArgument "<source>: ..." on malformed input (truncated,
// stack underflow, unknown memo entry, nesting past 512) and on opcodes
// outside the subset, naming the opcode and its offset. Survives arbitrary
// bytes (fuzzed: fuzz/torch_load_fuzzer.cc).
ValuePtr unpickle(std::string_view bytes, const Hooks& hooks, const std::string& source);

// "a dict", "a tensor", "collections.OrderedDict", ... for error messages.
std::string describe(const Value& v);

}  // namespace ddp::detail::pickle
