// The optimizer state's byte layout (optimizer_state.h), inside checkpoints
// and ZeroRedundancyOptimizer's consolidation messages.
#include "optimizer_state.h"

#include <string>

namespace ddp::detail {

void write_fields(ByteWriter& w, const OptimizerFields& fields) {
  w.u32(static_cast<uint32_t>(fields.size()));
  for (const OptimizerField& f : fields) {
    w.string(f.name);
    w.u8(static_cast<uint8_t>(f.kind));
    switch (f.kind) {
      case OptimizerField::Kind::kTensor: w.tensor(f.tensor); break;
      case OptimizerField::Kind::kInt: w.i64(f.integer); break;
      case OptimizerField::Kind::kReal: w.f64(f.real); break;
      case OptimizerField::Kind::kBool: w.u8(f.flag ? 1 : 0); break;
    }
  }
}

OptimizerFields read_fields(ByteReader& r, const c10::Device& device) {
  OptimizerFields fields(r.count("optimizer fields", 6));
  for (OptimizerField& f : fields) {
    f.name = r.string("an optimizer field name");
    uint8_t kind = r.u8();
    if (kind > 3) r.fail("optimizer field '" + f.name + "' has unknown kind " + std::to_string(kind));
    f.kind = static_cast<OptimizerField::Kind>(kind);
    switch (f.kind) {
      case OptimizerField::Kind::kTensor: f.tensor = r.tensor("an optimizer tensor", device); break;
      case OptimizerField::Kind::kInt: f.integer = r.i64(); break;
      case OptimizerField::Kind::kReal: f.real = r.f64(); break;
      case OptimizerField::Kind::kBool: f.flag = r.u8() != 0; break;
    }
  }
  return fields;
}

void write_optimizer(ByteWriter& w, const OptimizerState& s) {
  w.string(s.type);
  w.string(s.archive);
  w.u32(static_cast<uint32_t>(s.groups.size()));
  for (const auto& g : s.groups) {
    write_fields(w, g.options);
    w.u32(static_cast<uint32_t>(g.state.size()));
    for (const auto& st : g.state) {
      w.u8(st ? 1 : 0);
      if (st) write_fields(w, *st);
    }
  }
}

OptimizerState read_optimizer(ByteReader& r, const c10::Device& device) {
  OptimizerState s;
  s.type = r.string("the optimizer type");
  s.archive = r.string("the optimizer archive");
  s.groups.resize(r.count("parameter groups", 8));
  for (auto& g : s.groups) {
    g.options = read_fields(r, device);
    g.state.resize(r.count("group parameters", 1));
    for (auto& st : g.state) {
      uint8_t has = r.u8();
      if (has > 1) r.fail("a parameter state flag of " + std::to_string(has));
      if (has) st = read_fields(r, device);
    }
  }
  return s;
}

}  // namespace ddp::detail
