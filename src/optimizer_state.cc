// An optimizer's state as ddp::OptimizerState: the built-in optimizers field
// by field (so that reading never goes through libtorch's archive parser),
// any other optimizer through its own save()/load() archive, a
// ShardedOptimizer through its consolidated state.
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <optional>
#include <typeinfo>

#include "optimizer_state.h"

#include "compat/autograd_compat.h"
#include "ddp/error.h"
#include "tensor_text.h"

namespace ddp {
namespace detail {
namespace {

namespace optim = torch::optim;
using Kind = OptimizerField::Kind;

// The fields of each built-in optimizer: one list serves both directions
// (TORCH_ARG accessors return references).
template <class V> void visit(V& v, optim::SGDOptions& o) {
  v("lr", o.lr()); v("momentum", o.momentum()); v("dampening", o.dampening());
  v("weight_decay", o.weight_decay()); v("nesterov", o.nesterov());
}
template <class V> void visit(V& v, optim::SGDParamState& s) {
  v("momentum_buffer", s.momentum_buffer());
}
template <class V, class O> void visit_adam_options(V& v, O& o) {
  v("lr", o.lr()); v("beta1", std::get<0>(o.betas()));
  v("beta2", std::get<1>(o.betas())); v("eps", o.eps());
  v("weight_decay", o.weight_decay()); v("amsgrad", o.amsgrad());
}
template <class V, class S> void visit_adam_state(V& v, S& s) {
  v("step", s.step()); v("exp_avg", s.exp_avg());
  v("exp_avg_sq", s.exp_avg_sq()); v("max_exp_avg_sq", s.max_exp_avg_sq());
}
template <class V> void visit(V& v, optim::AdamOptions& o) { visit_adam_options(v, o); }
template <class V> void visit(V& v, optim::AdamParamState& s) { visit_adam_state(v, s); }
template <class V> void visit(V& v, optim::AdamWOptions& o) { visit_adam_options(v, o); }
template <class V> void visit(V& v, optim::AdamWParamState& s) { visit_adam_state(v, s); }
template <class V> void visit(V& v, optim::AdagradOptions& o) {
  v("lr", o.lr()); v("lr_decay", o.lr_decay()); v("weight_decay", o.weight_decay());
  v("initial_accumulator_value", o.initial_accumulator_value()); v("eps", o.eps());
}
template <class V> void visit(V& v, optim::AdagradParamState& s) {
  v("sum", s.sum()); v("step", s.step());
}
template <class V> void visit(V& v, optim::RMSpropOptions& o) {
  v("lr", o.lr()); v("alpha", o.alpha()); v("eps", o.eps());
  v("weight_decay", o.weight_decay()); v("momentum", o.momentum());
  v("centered", o.centered());
}
template <class V> void visit(V& v, optim::RMSpropParamState& s) {
  v("step", s.step()); v("square_avg", s.square_avg());
  v("momentum_buffer", s.momentum_buffer()); v("grad_avg", s.grad_avg());
}

// Reads fields out of an object (a clone: the optimizer is not touched).
struct Collect {
  OptimizerFields out;
  OptimizerField& add(const char* name, Kind kind) {
    out.emplace_back();
    out.back().name = name;
    out.back().kind = kind;
    return out.back();
  }
  void operator()(const char* n, double& v) { add(n, Kind::kReal).real = v; }
  void operator()(const char* n, int64_t& v) { add(n, Kind::kInt).integer = v; }
  void operator()(const char* n, bool& v) { add(n, Kind::kBool).flag = v; }
  void operator()(const char* n, at::Tensor& v) {
    // A copy: the optimizer keeps updating its buffers in place.
    add(n, Kind::kTensor).tensor =
        v.defined() ? v.detach().to(at::kCPU).clone() : at::Tensor();
  }
};

// Writes fields into an object by name, checking kinds and tensor shapes.
struct Apply {
  const OptimizerFields& in;
  const std::string& where;          // for messages
  const at::Tensor* param = nullptr;  // per-parameter state: its parameter

  const OptimizerField& find(const char* name, Kind kind) {
    for (const OptimizerField& f : in) {
      if (f.name != name) continue;
      if (f.kind != kind) break;
      return f;
    }
    throw InvalidArgument(where + " lacks field '" + name +
                          "' of the expected kind (saved by another "
                          "optimizer or another ddp version?)");
  }
  void operator()(const char* n, double& v) { v = find(n, Kind::kReal).real; }
  void operator()(const char* n, int64_t& v) { v = find(n, Kind::kInt).integer; }
  void operator()(const char* n, bool& v) { v = find(n, Kind::kBool).flag; }
  void operator()(const char* n, at::Tensor& v) {
    const at::Tensor& t = find(n, Kind::kTensor).tensor;
    if (t.defined() && param != nullptr &&
        (t.sizes() != param->sizes() || t.scalar_type() != param->scalar_type())) {
      throw InvalidArgument(
          where + ": '" + n + "' is " + detail::describe_tensor(t) +
          " but the parameter is " + detail::describe_tensor(*param) +
          " (a checkpoint of another model?)");
    }
    v = t.defined() && param != nullptr ? t.to(param->device()) : t;
  }
};

struct Codec {
  const char* name;
  bool (*matches)(const optim::Optimizer&);
  OptimizerFields (*options)(const optim::OptimizerOptions&);
  OptimizerFields (*state)(const optim::OptimizerParamState&);
  // A copy of `current` with the fields applied.
  std::unique_ptr<optim::OptimizerOptions> (*make_options)(
      const optim::OptimizerOptions& current, const OptimizerFields&,
      const std::string& where);
  std::unique_ptr<optim::OptimizerParamState> (*make_state)(
      const OptimizerFields&, const at::Tensor& param, const std::string& where);
};

template <class Opt, class Options, class State>
Codec codec(const char* name) {
  Codec c;
  c.name = name;
  c.matches = [](const optim::Optimizer& o) { return typeid(o) == typeid(Opt); };
  c.options = [](const optim::OptimizerOptions& o) {
    auto copy = o.clone();
    Collect col;
    visit(col, static_cast<Options&>(*copy));
    return std::move(col.out);
  };
  c.state = [](const optim::OptimizerParamState& s) {
    auto copy = s.clone();
    Collect col;
    visit(col, static_cast<State&>(*copy));
    return std::move(col.out);
  };
  c.make_options = [](const optim::OptimizerOptions& current,
                      const OptimizerFields& f, const std::string& where) {
    auto copy = current.clone();
    Apply a{f, where};
    visit(a, static_cast<Options&>(*copy));
    return copy;
  };
  c.make_state = [](const OptimizerFields& f, const at::Tensor& param,
                    const std::string& where) {
    auto s = std::make_unique<State>();
    Apply a{f, where, &param};
    visit(a, *s);
    return std::unique_ptr<optim::OptimizerParamState>(std::move(s));
  };
  return c;
}

const std::vector<Codec>& codecs() {
  static const std::vector<Codec> all = {
      codec<optim::SGD, optim::SGDOptions, optim::SGDParamState>("SGD"),
      codec<optim::Adam, optim::AdamOptions, optim::AdamParamState>("Adam"),
      codec<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState>("AdamW"),
      codec<optim::Adagrad, optim::AdagradOptions, optim::AdagradParamState>("Adagrad"),
      codec<optim::RMSprop, optim::RMSpropOptions, optim::RMSpropParamState>("RMSprop")};
  return all;
}

const Codec* codec_for(const optim::Optimizer& o) {
  for (const Codec& c : codecs()) {
    if (c.matches(o)) return &c;
  }
  return nullptr;
}

std::string archive_type(const optim::Optimizer& o) {
  return "archive:" + c10::demangle(typeid(o).name());
}

std::optional<double> lr_of(const optim::OptimizerParamGroup& group) {
  if (!group.has_options()) return std::nullopt;
  try {
    return group.options().get_lr();
  } catch (const c10::Error&) {
    return std::nullopt;  // options without get_lr()
  }
}

compat::OptimizerStateKey key_of(const at::Tensor& p) {
  return compat::optimizer_state_key(p);
}

}  // namespace

OptimizerState capture_optimizer(const optim::Optimizer& optimizer) {
  // Sharded: the consolidated state of the equivalent unsharded optimizer.
  if (auto* sharded = dynamic_cast<const ShardedOptimizer*>(&optimizer)) {
    return *sharded->state_dict();
  }
  OptimizerState s;
  const Codec* c = codec_for(optimizer);
  if (c == nullptr) {
    s.type = archive_type(optimizer);
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to([&](const void* p, size_t n) {
      s.archive.append(static_cast<const char*>(p), n);
      return n;
    });
    // libtorch's load() ignores the saved options; keep at least each
    // group's lr (what schedulers change) through the generic get_lr().
    for (const auto& group : optimizer.param_groups()) {
      OptimizerState::Group g;
      if (auto lr = lr_of(group)) {
        g.options.emplace_back();
        g.options.back().name = "lr";
        g.options.back().real = *lr;
      }
      s.groups.push_back(std::move(g));
    }
    return s;
  }
  s.type = c->name;
  for (const auto& group : optimizer.param_groups()) {
    OptimizerState::Group g;
    g.options = c->options(group.options());
    for (const at::Tensor& p : group.params()) {
      auto it = optimizer.state().find(key_of(p));
      if (it == optimizer.state().end()) {
        g.state.emplace_back();
      } else {
        g.state.emplace_back(c->state(*it->second));
      }
    }
    s.groups.push_back(std::move(g));
  }
  return s;
}

namespace {
void restore_archive(const OptimizerState& s, optim::Optimizer& optimizer,
                     const std::string& source) {
  auto& groups = optimizer.param_groups();
  if (s.groups.size() != groups.size()) {
    throw InvalidArgument("checkpoint '" + source + "' has " +
                          std::to_string(s.groups.size()) +
                          " parameter groups, the optimizer " +
                          std::to_string(groups.size()));
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(s.archive.data(), s.archive.size());
    optimizer.load(archive);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const OptimizerField& f : s.groups[g].options) {
        if (f.name == "lr" && f.kind == Kind::kReal && groups[g].has_options()) {
          groups[g].options().set_lr(f.real);
        }
      }
    }
  } catch (const std::exception& e) {
    throw InvalidArgument("checkpoint '" + source + "': libtorch could not "
                          "load the " + s.type.substr(8) +
                          " optimizer state: " + e.what());
  }
}
}  // namespace

void restore_optimizer(const OptimizerState& s, optim::Optimizer& optimizer,
                       const std::string& source) {
  if (auto* sharded = dynamic_cast<ShardedOptimizer*>(&optimizer)) {
    return sharded->load_state_dict(s, source);
  }
  const Codec* c = codec_for(optimizer);
  const std::string type = c ? c->name : archive_type(optimizer);
  const std::string where = "checkpoint '" + source + "'";
  if (s.type != type) {
    throw InvalidArgument(where + " holds the state of an optimizer of type " +
                          s.type + ", but the optimizer is of type " + type +
                          "; create the optimizer the checkpoint was saved "
                          "with, or restore without the optimizer");
  }
  if (c == nullptr) return restore_archive(s, optimizer, source);
  auto& groups = optimizer.param_groups();
  if (s.groups.size() != groups.size()) {
    throw InvalidArgument(where + " has " + std::to_string(s.groups.size()) +
                          " parameter groups, the optimizer " +
                          std::to_string(groups.size()));
  }
  // Build everything first, so that a mismatch leaves the optimizer as is.
  std::vector<std::unique_ptr<optim::OptimizerOptions>> options;
  std::vector<std::vector<std::unique_ptr<optim::OptimizerParamState>>> states;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const std::string gw = where + " optimizer group " + std::to_string(g);
    if (s.groups[g].state.size() != params.size()) {
      throw InvalidArgument(gw + " has " + std::to_string(s.groups[g].state.size()) +
                            " parameters, the optimizer's " +
                            std::to_string(params.size()));
    }
    options.push_back(c->make_options(groups[g].options(), s.groups[g].options, gw));
    states.emplace_back();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& st = s.groups[g].state[i];
      states.back().push_back(
          st ? c->make_state(*st, params[i], gw + " parameter " + std::to_string(i))
             : nullptr);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].set_options(std::move(options[g]));
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto key = key_of(groups[g].params()[i]);
      if (states[g][i]) {
        optimizer.state()[key] = std::move(states[g][i]);
      } else {
        optimizer.state().erase(key);
      }
    }
  }
}

}  // namespace detail
}  // namespace ddp
