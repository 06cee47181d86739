#include "unpickler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "ddp/error.h"

namespace ddp::detail::pickle {
namespace {

using Kind = Value::Kind;

// Deeper nesting is refused: a state dict nests three levels; a value
// freed recursively must not exhaust the stack.
constexpr int kMaxDepth = 512;

// Note [Frozen values]: a container placed inside another (or passed to a
// REDUCE) is frozen, and a frozen container is never changed again. So a
// container's depth, computed when something is inserted, stays exact, and
// no cycle can form (shared_ptr cycles would leak): Python pickles a
// recursive structure by changing a container after its use, which
// torch.save never needs for a state dict.
class Machine {
 public:
  Machine(std::string_view bytes, const Hooks& hooks, const std::string& source)
      : bytes_(bytes), hooks_(hooks), source_(source) {}

  ValuePtr run() {
    while (true) {
      op_at_ = pos_;
      if (!step(u8())) break;
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("STOP with a malformed stack");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: malformed pickle (opcode at byte {}): {}", source_,
                                      op_at_, what));
  }

  std::string_view take(uint64_t n) {
    if (n > bytes_.size() - pos_) fail("truncated");
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(int n) {
    std::string_view b = take(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  }
  std::string line() {
    size_t end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) fail("truncated GLOBAL");
    std::string out(bytes_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("stack underflow");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    std::vector<ValuePtr> out(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                              stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return out;
  }

  // `child` goes inside `parent` (see Note [Frozen values]).
  void adopt(Value& parent, const ValuePtr& child) {
    if (child.get() == &parent) fail("puts a container inside itself (recursive objects are not read)");
    child->frozen = true;
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxDepth) fail(fmt::format("nesting deeper than {}", kMaxDepth));
  }
  Value& mutable_container(Kind kind) {
    Value& c = *top();
    if (c.kind != kind) fail(fmt::format("adds items to {}", describe(c)));
    if (c.frozen) {
      fail("changes a container already inside another (recursive objects are not read)");
    }
    return c;
  }
  ValuePtr sequence(Kind kind, std::vector<ValuePtr> items) {
    ValuePtr v = make(kind);
    for (const auto& item : items) adopt(*v, item);
    v->items = std::move(items);
    return v;
  }
  void append(std::vector<ValuePtr> items) {
    Value& list = mutable_container(Kind::kList);
    for (auto& item : items) {
      adopt(list, item);
      list.items.push_back(std::move(item));
    }
  }
  void set_items(std::vector<ValuePtr> flat) {
    if (flat.size() % 2 != 0) fail("SETITEMS with an odd number of values");
    Value& dict = mutable_container(Kind::kDict);
    for (size_t i = 0; i < flat.size(); i += 2) {
      adopt(dict, flat[i]);
      adopt(dict, flat[i + 1]);
      dict.entries.emplace_back(std::move(flat[i]), std::move(flat[i + 1]));
    }
  }
  ValuePtr scalar(Kind kind) { return make(kind); }
  ValuePtr integer(int64_t i) {
    ValuePtr v = make(Kind::kInt);
    v->integer = i;
    return v;
  }
  ValuePtr text(Kind kind, std::string_view s) {
    ValuePtr v = make(kind);
    v->text = std::string(s);
    return v;
  }
  ValuePtr global(const std::string& module, const std::string& name) {
    return text(Kind::kGlobal, module + "." + name);
  }
  ValuePtr call(const ValuePtr& args) {
    ValuePtr callable = pop();
    if (callable->kind != Kind::kGlobal) fail(fmt::format("calls {}", describe(*callable)));
    if (args->kind != Kind::kTuple) fail(fmt::format("calls with {}", describe(*args)));
    args->frozen = true;
    ValuePtr out = hooks_.reduce(callable->text, *args);
    if (!out) fail("no value for " + callable->text);
    return out;
  }
  ValuePtr long1() {
    const uint8_t n = u8();
    if (n > 8) fail("an integer wider than 64 bits");
    if (n == 0) return integer(0);
    uint64_t raw = le(n);
    if (n < 8 && (raw >> (8 * n - 1)) != 0) raw |= ~uint64_t{0} << (8 * n);  // sign-extend
    return integer(static_cast<int64_t>(raw));
  }
  ValuePtr binfloat() {
    std::string_view b = take(8);
    uint64_t bits = 0;
    for (char c : b) bits = (bits << 8) | static_cast<uint8_t>(c);  // big-endian
    ValuePtr v = make(Kind::kFloat);
    std::memcpy(&v->real, &bits, sizeof bits);
    return v;
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  ValuePtr memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo entry {} was never stored", index));
    return it->second;
  }
  ValuePtr stack_global() {
    ValuePtr name = pop(), module = pop();
    if (name->kind != Kind::kString || module->kind != Kind::kString) {
      fail("STACK_GLOBAL of a non-string");
    }
    return global(module->text, name->text);
  }

  bool step(uint8_t op);

  std::string_view bytes_;
  const Hooks& hooks_;
  const std::string& source_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
};

bool Machine::step(uint8_t op) {
  switch (op) {
    case 0x80: if (u8() > 5) fail("pickle protocol above 5"); break;           // PROTO
    case 0x95: le(8); break;                                                   // FRAME
    case '.': return false;                                                    // STOP
    case '(': marks_.push_back(stack_.size()); break;                          // MARK
    case '1': pop_mark(); break;                                               // POP_MARK
    case '0': pop(); break;                                                    // POP
    case '2': push(top()); break;                                              // DUP
    case ')': push(make(Kind::kTuple)); break;                                 // EMPTY_TUPLE
    case ']': push(make(Kind::kList)); break;                                  // EMPTY_LIST
    case '}': push(make(Kind::kDict)); break;                                  // EMPTY_DICT
    case 'N': push(scalar(Kind::kNone)); break;                                // NONE
    case 0x88: case 0x89: {                                                    // NEWTRUE/FALSE
      ValuePtr b = make(Kind::kBool);
      b->boolean = op == 0x88;
      b->integer = b->boolean;
      push(b);
      break;
    }
    case 'K': push(integer(u8())); break;                                      // BININT1
    case 'M': push(integer(static_cast<int64_t>(le(2)))); break;               // BININT2
    case 'J': push(integer(static_cast<int32_t>(le(4)))); break;               // BININT
    case 0x8a: push(long1()); break;                                           // LONG1
    case 'G': push(binfloat()); break;                                         // BINFLOAT
    case 0x8c: case 'U': push(text(Kind::kString, take(u8()))); break;         // SHORT_BINUNICODE
    case 'X': case 'T': push(text(Kind::kString, take(le(4)))); break;         // BINUNICODE
    case 0x8d: push(text(Kind::kString, take(le(8)))); break;                  // BINUNICODE8
    case 'C': push(text(Kind::kBytes, take(u8()))); break;                     // SHORT_BINBYTES
    case 'B': push(text(Kind::kBytes, take(le(4)))); break;                    // BINBYTES
    case 0x8e: push(text(Kind::kBytes, take(le(8)))); break;                   // BINBYTES8
    case 'c': { std::string m = line(); push(global(m, line())); break; }      // GLOBAL
    case 0x93: push(stack_global()); break;                                    // STACK_GLOBAL
    case 'q': memo_put(u8()); break;                                           // BINPUT
    case 'r': memo_put(le(4)); break;                                          // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); break;                                  // MEMOIZE
    case 'h': push(memo_get(u8())); break;                                     // BINGET
    case 'j': push(memo_get(le(4))); break;                                    // LONG_BINGET
    case 't': push(sequence(Kind::kTuple, pop_mark())); break;                 // TUPLE
    case 0x85: case 0x86: case 0x87: {                                         // TUPLE1..3
      std::vector<ValuePtr> items(op - 0x84);
      for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
      push(sequence(Kind::kTuple, std::move(items)));
      break;
    }
    case 'l': push(sequence(Kind::kList, pop_mark())); break;                  // LIST
    case 'a': { ValuePtr v = pop(); append({v}); break; }                      // APPEND
    case 'e': append(pop_mark()); break;                                       // APPENDS
    case 'd': { auto flat = pop_mark(); push(make(Kind::kDict)); set_items(flat); break; }  // DICT
    case 's': { ValuePtr v = pop(), k = pop(); set_items({k, v}); break; }     // SETITEM
    case 'u': set_items(pop_mark()); break;                                    // SETITEMS
    case 'R': case 0x81: { ValuePtr args = pop(); push(call(args)); break; }   // REDUCE, NEWOBJ
    case 'b': pop(); top(); break;  // BUILD: attributes (a state dict's _metadata) are dropped
    case 'Q': {                                                                // BINPERSID
      ValuePtr pid = pop();
      pid->frozen = true;
      ValuePtr v = hooks_.persistent_load(*pid);
      if (!v) fail("no value for a persistent id");
      push(v);
      break;
    }
    default:
      fail(fmt::format("opcode 0x{:02x} is outside what torch.save writes for a state dict "
                       "(ddp reads dicts, lists, tuples, strings, numbers and tensors)",
                       op));
  }
  return true;
}

}  // namespace

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

ValuePtr unpickle(std::string_view bytes, const Hooks& hooks, const std::string& source) {
  return Machine(bytes, hooks, source).run();
}

std::string describe(const Value& v) {
  switch (v.kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "a bool";
    case Kind::kInt: return "an int";
    case Kind::kFloat: return "a float";
    case Kind::kString: return "a string";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "a tuple";
    case Kind::kList: return "a list";
    case Kind::kDict: return "a dict";
    case Kind::kGlobal: return v.text;
    case Kind::kTensor: return "a tensor";
  }
  return "a value";
}

}  // namespace ddp::detail::pickle
