#include "torch_load.h"

#include <ATen/ops/empty.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>

#include "ddp/error.h"
#include "unpickler.h"

namespace ddp::detail {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using Kind = Value::Kind;

// The archive's bytes for the zip reader. Not libtorch's MemoryReadAdapter:
// it copies whatever range it is asked for, and a damaged central directory
// asks for one past the end (found by fuzz/torch_load_fuzzer.cc). Here a
// read past the end returns what there is, which the zip reader reports as
// a short read.
class BoundedReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

// torch.<Name>Storage, as torch.save names a typed storage's class.
bool storage_dtype(const std::string& global, at::ScalarType* out) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"torch.DoubleStorage", at::kDouble},   {"torch.FloatStorage", at::kFloat},
      {"torch.HalfStorage", at::kHalf},       {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},       {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},     {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},       {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble},
      {"torch.UntypedStorage", at::kByte}};
  auto it = kTypes.find(global);
  if (it == kTypes.end()) return false;
  *out = it->second;
  return true;
}

int64_t as_int(const Value& v, const std::string& what, const std::string& source) {
  if (v.kind != Kind::kInt && v.kind != Kind::kBool) {
    throw InvalidArgument(fmt::format("{}: {} is {}, not an int", source, what,
                                      pickle::describe(v)));
  }
  return v.integer;
}

std::vector<int64_t> int_tuple(const Value& v, const std::string& what,
                               const std::string& source) {
  if (v.kind != Kind::kTuple && v.kind != Kind::kList) {
    throw InvalidArgument(fmt::format("{}: {} is {}, not a tuple", source, what,
                                      pickle::describe(v)));
  }
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(as_int(*item, what, source));
  return out;
}

// Builds the objects of a state dict's pickle; refuses every other global.
class TorchObjects {
 public:
  TorchObjects(caffe2::serialize::PyTorchStreamReader& zip, const std::string& source)
      : zip_(zip), source_(source) {}

  pickle::Hooks hooks() {
    return {[this](const Value& pid) { return storage(pid); },
            [this](const std::string& name, const Value& args) { return reduce(name, args); }};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: {}", source_, what));
  }

  // ('storage', torch.FloatStorage, key, location, numel): data/<key> as
  // a 1-D CPU tensor of numel elements, read once per key.
  ValuePtr storage(const Value& pid) {
    if (pid.kind != Kind::kTuple || pid.items.size() != 5 ||
        pid.items[0]->kind != Kind::kString || pid.items[0]->text != "storage" ||
        pid.items[1]->kind != Kind::kGlobal || pid.items[2]->kind != Kind::kString) {
      fail("a persistent id that is not torch.save's ('storage', type, key, location, numel)");
    }
    at::ScalarType dtype;
    if (!storage_dtype(pid.items[1]->text, &dtype)) {
      fail("a storage of type " + pid.items[1]->text + ", which ddp does not read");
    }
    const std::string& key = pid.items[2]->text;
    const int64_t numel = as_int(*pid.items[4], "a storage's numel", source_);
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const std::string record = "data/" + key;
    if (!zip_.hasRecord(record)) fail("the storage record '" + record + "' is missing");
    auto [data, size] = zip_.getRecord(record);
    const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
    if (numel < 0 || numel > static_cast<int64_t>(size) / item) {
      fail(fmt::format("the storage record '{}' holds {} bytes, fewer than its {} elements of "
                       "{} bytes",
                       record, size, numel, item));
    }
    ValuePtr v = pickle::make(Kind::kTensor);
    v->tensor = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (numel > 0) std::memcpy(v->tensor.data_ptr(), data.get(), numel * item);
    storages_[key] = v;
    return v;
  }

  ValuePtr reduce(const std::string& name, const Value& args) {
    const auto& a = args.items;
    if (name == "collections.OrderedDict") {
      if (!a.empty()) fail("collections.OrderedDict called with items (expected none)");
      return pickle::make(Kind::kDict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" && (a.size() == 6 || a.size() == 7)) {
      return rebuild_tensor(*a[0], *a[1], *a[2], *a[3]);
    }
    if ((name == "torch._utils._rebuild_parameter" && a.size() == 3) ||
        (name == "torch._utils._rebuild_parameter_with_state" && a.size() == 4)) {
      if (a[0]->kind != Kind::kTensor) fail(name + " of " + pickle::describe(*a[0]));
      return a[0];
    }
    if (name == "torch._tensor._rebuild_from_type_v2" && a.size() == 4 &&
        a[0]->kind == Kind::kGlobal && a[2]->kind == Kind::kTuple) {
      return reduce(a[0]->text, *a[2]);  // the tensor subclass and its state are dropped
    }
    fail(fmt::format(
        "it holds a {} object (called with {} arguments), which ddp does not read: a state "
        "dict holds tensors. Save model.state_dict() rather than the model (Python's "
        "torch.load(weights_only=True) refuses such objects too)",
        name, a.size()));
  }

  ValuePtr rebuild_tensor(const Value& storage, const Value& offset_v, const Value& size_v,
                          const Value& stride_v) {
    if (storage.kind != Kind::kTensor) fail("a tensor rebuilt from " + pickle::describe(storage));
    const int64_t offset = as_int(offset_v, "a tensor's storage offset", source_);
    const std::vector<int64_t> sizes = int_tuple(size_v, "a tensor's size", source_);
    const std::vector<int64_t> strides = int_tuple(stride_v, "a tensor's stride", source_);
    if (sizes.size() != strides.size()) fail("a tensor with sizes and strides of other lengths");
    // The highest element reached must lie inside the storage; checked in
    // 128 bits so that no size overflows.
    __int128 last = offset, count = 1;
    bool ok = offset >= 0 && sizes.size() <= 64;
    for (size_t i = 0; i < sizes.size() && ok; ++i) {
      ok = sizes[i] >= 0 && strides[i] >= 0 && sizes[i] <= (int64_t{1} << 48);
      count *= sizes[i];
      ok = ok && count <= (__int128{1} << 62);
      if (sizes[i] > 0) last += static_cast<__int128>(sizes[i] - 1) * strides[i];
    }
    const int64_t numel = storage.tensor.numel();
    if (!ok || (count > 0 && last >= numel)) {
      fail(fmt::format("a tensor of sizes {} and strides {} at offset {} lies outside its "
                       "storage of {} elements",
                       fmt::join(sizes, "x"), fmt::join(strides, ","), offset, numel));
    }
    ValuePtr v = pickle::make(Kind::kTensor);
    v->tensor = at::empty({0}, storage.tensor.options())
                    .set_(storage.tensor.storage(), offset, sizes, strides);
    return v;
  }

  caffe2::serialize::PyTorchStreamReader& zip_;
  const std::string& source_;
  std::map<std::string, ValuePtr> storages_;
};

std::string quoted_keys(const Value& dict) {
  std::string out;
  size_t n = 0;
  for (const auto& [k, v] : dict.entries) {
    if (n++ == 8) return out + ", ...";
    if (!out.empty()) out += ", ";
    out += k->kind == Kind::kString ? "'" + k->text + "'" : pickle::describe(*k);
  }
  return out;
}

// A dict with entries that are not tensors: the saved dict of a training
// script ({"model": ..., "epoch": 3}) when one of them is a dict.
InvalidArgument not_tensors(const Value& dict, const std::string& key, const std::string& source) {
  std::string nested;
  for (const auto& [k, v] : dict.entries) {
    if (nested.empty() && v->kind == Kind::kDict && k->kind == Kind::kString) nested = k->text;
  }
  if (key.empty() && !nested.empty()) {
    return InvalidArgument(fmt::format(
        "{}: holds a dict of other things (keys: {}), not a state dict: name the entry that is "
        "one (StateDictOptions::key = \"{}\")",
        source, quoted_keys(dict), nested));
  }
  for (const auto& [k, v] : dict.entries) {
    if (v->kind != Kind::kTensor) {
      return InvalidArgument(fmt::format(
          "{}: the entry '{}'{} is {}, not a tensor: not a state dict (keys: {})", source,
          k->kind == Kind::kString ? k->text : pickle::describe(*k),
          key.empty() ? "" : " of '" + key + "'", pickle::describe(*v), quoted_keys(dict)));
    }
  }
  return InvalidArgument(source + ": not a state dict");
}

// The dict `root` is, or its entry `key`; every value a tensor.
torch::OrderedDict<std::string, at::Tensor> tensors_of(const Value& root, const std::string& key,
                                                       const std::string& source) {
  if (root.kind != Kind::kDict) {
    throw InvalidArgument(fmt::format(
        "{}: holds {}, not a state dict (a dict of tensors); save model.state_dict()", source,
        pickle::describe(root)));
  }
  const Value* dict = &root;
  if (!key.empty()) {
    dict = nullptr;
    for (const auto& [k, v] : root.entries) {
      if (k->kind == Kind::kString && k->text == key) dict = v.get();
    }
    if (dict == nullptr || dict->kind != Kind::kDict) {
      throw InvalidArgument(fmt::format("{}: {} (its keys: {})", source,
                                        dict ? "the entry '" + key + "' is " +
                                                   pickle::describe(*dict) + ", not a dict"
                                             : "has no entry '" + key + "'",
                                        quoted_keys(root)));
    }
  }
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& [k, v] : dict->entries) {
    if (k->kind != Kind::kString) {
      throw InvalidArgument(source + ": a state dict key is " + pickle::describe(*k));
    }
    if (v->kind != Kind::kTensor) throw not_tensors(*dict, key, source);
    if (out.contains(k->text)) throw InvalidArgument(source + ": the key '" + k->text + "' twice");
    out.insert(k->text, v->tensor);
  }
  return out;
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> parse_torch_state_dict(const std::string& bytes,
                                                                   const std::string& source,
                                                                   const std::string& key) {
  if (bytes.size() < 4 || bytes.compare(0, 4, "PK\x03\x04") != 0) {
    throw InvalidArgument(fmt::format(
        "{}: not a torch.save zip archive{}. ddp reads the zip format that torch.save writes "
        "by default since PyTorch 1.6; resave in Python with "
        "torch.save(torch.load(path), path)",
        source,
        !bytes.empty() && static_cast<uint8_t>(bytes[0]) == 0x80
            ? " (a pickle: torch.save's legacy format, _use_new_zipfile_serialization=False)"
            : ""));
  }
  try {
    caffe2::serialize::PyTorchStreamReader zip(
        std::make_shared<BoundedReader>(bytes));
    if (zip.hasRecord("constants.pkl")) {
      throw InvalidArgument(source + ": a TorchScript module (torch.jit.save); load it with "
                                     "torch::jit::load, or save model.state_dict() in Python");
    }
    if (!zip.hasRecord("data.pkl")) {
      throw InvalidArgument(source + ": a zip archive without data.pkl, not a torch.save file");
    }
    if (zip.hasRecord("byteorder")) {
      auto [order, n] = zip.getRecord("byteorder");
      if (std::string(static_cast<const char*>(order.get()), n) != "little") {
        throw InvalidArgument(source + ": written on a big-endian machine, which ddp does not read");
      }
    }
    auto [data, size] = zip.getRecord("data.pkl");
    TorchObjects objects(zip, source);
    ValuePtr root = pickle::unpickle(
        std::string_view(static_cast<const char*>(data.get()), size), objects.hooks(), source);
    return tensors_of(*root, key, source);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the zip reader's c10::Error
    const std::string what = e.what();
    throw InvalidArgument(fmt::format("{}: a damaged torch.save archive: {}", source,
                                      what.substr(0, what.find('\n'))));
  }
}

}  // namespace ddp::detail
