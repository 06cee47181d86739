// fully_shard's free functions (include/ddp/fully_shard.h): sharding a
// unit and forming its tree, gradient sync, full state dicts, clipping.
#include "ddp/fully_shard.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Type.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>

#include "ddp/collectives.h"
#include "ddp/error.h"
#include "fsdp/fsdp_unit.h"

namespace ddp {
namespace detail {

void fsdp_pre_forward(FsdpUnit& unit, const std::vector<at::Tensor>& inputs) {
  unit.pre_forward(inputs);
}
void fsdp_post_forward(FsdpUnit& unit, const std::vector<at::Tensor>& outputs,
                       bool outputs_known) {
  unit.post_forward(outputs, outputs_known);
}

std::optional<at::ScalarType> fsdp_input_dtype(const FsdpUnit& unit) { return unit.input_dtype(); }
std::optional<at::ScalarType> fsdp_output_dtype(const FsdpUnit& unit) {
  return unit.output_dtype();
}
void fsdp_output_not_castable(const FsdpUnit& unit, const char* type) {
  throw InvalidArgument(fmt::format(
      "fully_shard({}): MixedPrecisionPolicy::output_dtype is set, but forward returns {}, "
      "whose tensors fully_shard cannot replace: return an at::Tensor, a std::vector or a "
      "std::tuple of them, or cast in forward and leave output_dtype unset",
      unit.name(), c10::demangle(type)));
}

namespace {

// Which unit shards each parameter, process-wide: a parameter shared by two
// units is refused with both names.
std::mutex registry_mu;
std::unordered_map<const c10::TensorImpl*, std::weak_ptr<FsdpUnit>>& registry() {
  static std::unordered_map<const c10::TensorImpl*, std::weak_ptr<FsdpUnit>> r;
  return r;
}

struct InnerUnit {
  std::string path;  // module path under the unit being sharded
  FsdpUnit* state;
};

bool under(const std::string& name, const std::vector<InnerUnit>& inner) {
  for (const InnerUnit& u : inner) {
    if (name.compare(0, u.path.size() + 1, u.path + ".") == 0) return true;
  }
  return false;
}

}  // namespace

// The unit's own parameters: its module's, less those under inner units;
// a tensor reached both from inside an inner unit and from outside it is
// refused (it would be read sharded by the outside use).
std::vector<std::pair<std::string, at::Tensor>> own_parameters(
    torch::nn::Module& m, const std::vector<InnerUnit>& inner, const std::string& unit_name) {
  std::map<const c10::TensorImpl*, std::string> inner_names;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    if (under(item.key(), inner)) inner_names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::vector<std::pair<std::string, at::Tensor>> own;
  std::map<const c10::TensorImpl*, std::string> seen;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (under(item.key(), inner)) continue;
    auto in = inner_names.find(impl);
    if (in != inner_names.end()) {
      throw InvalidArgument(fmt::format(
          "fully_shard({}): parameter '{}' is the same tensor as '{}' of an inner unit: a "
          "parameter shared by two units is not supported (its uses would see different "
          "shards); keep both uses inside one unit",
          unit_name, item.key(), in->second));
    }
    if (!seen.emplace(impl, item.key()).second) continue;  // tied within the unit
    own.emplace_back(item.key(), item.value());
  }
  return own;
}

// The unit's name in messages: its module type without namespaces or our
// wrapper ("BlockImpl", not "ddp::FullyShardImpl<app::BlockImpl>").
std::string unit_name_of(const torch::nn::Module& m) {
  std::string name = m.name();
  const std::string wrapper = "ddp::FullyShardImpl<";
  if (name.compare(0, wrapper.size(), wrapper) == 0 && name.back() == '>') {
    name = name.substr(wrapper.size(), name.size() - wrapper.size() - 1);
  }
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace detail

void fully_shard(FullyShardUnit& unit, const FullyShardOptions& options) {
  using detail::FsdpUnit;
  torch::nn::Module& m = unit.unit_module();
  const std::string unit_name = detail::unit_name_of(m);
  if (unit.is_sharded()) {
    throw InvalidArgument(fmt::format("fully_shard({}): this unit is sharded already", unit_name));
  }
  std::vector<detail::InnerUnit> inner;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    auto* u = dynamic_cast<FullyShardUnit*>(item.value().get());
    if (u == nullptr || detail::under(item.key(), inner)) continue;
    if (!u->is_sharded()) {
      throw InvalidArgument(fmt::format(
          "fully_shard({}): its unit '{}' is not sharded yet: shard inner units first "
          "(fully_shard(inner) before fully_shard(outer)), as FSDP2",
          unit_name, item.key()));
    }
    inner.push_back({item.key(), u->fsdp_state()});
  }
  auto own = detail::own_parameters(m, inner, unit_name);
  {
    std::lock_guard<std::mutex> lock(detail::registry_mu);
    for (const auto& [name, t] : own) {
      auto it = detail::registry().find(t.unsafeGetTensorImpl());
      if (it != detail::registry().end() && !it->second.expired()) {
        throw InvalidArgument(fmt::format(
            "fully_shard({}): parameter '{}' is sharded already by unit {}: a parameter "
            "shared by two units is not supported; keep both uses inside one unit",
            unit_name, name, it->second.lock()->name()));
      }
    }
  }
  std::shared_ptr<FsdpUnit> state = FsdpUnit::create(unit_name, std::move(own), options);
  {
    std::lock_guard<std::mutex> lock(detail::registry_mu);
    for (const auto& p : state->params()) {
      detail::registry()[p.param.unsafeGetTensorImpl()] = state;
    }
  }
  // The tree: every unit inside, in the order they were sharded, then this.
  auto tree = std::make_shared<detail::FsdpTree>();
  for (const detail::InnerUnit& u : inner) {
    for (const auto& w : u.state->tree()->units) tree->units.push_back(w);
  }
  tree->units.push_back(state);
  for (const auto& w : tree->units) w.lock()->set_tree(tree);
  unit.set_fsdp_state(std::move(state));
}

namespace detail {

FsdpUnit& sharded_root(FullyShardUnit& root, const char* what) {
  if (!root.is_sharded()) {
    throw InvalidArgument(fmt::format("{}({}): the module is not sharded: call "
                                      "ddp::fully_shard on it first",
                                      what, unit_name_of(root.unit_module())));
  }
  return *root.fsdp_state();
}

ParamIndex param_index(FsdpUnit& root) {
  ParamIndex index;
  for (const auto& w : root.tree()->units) {
    auto u = w.lock();
    for (size_t i = 0; i < u->params().size(); ++i) {
      index[u->params()[i].param.unsafeGetTensorImpl()] = {u.get(), i};
    }
  }
  return index;
}

}  // namespace detail

using detail::param_index;
using detail::sharded_root;

void set_requires_gradient_sync(FullyShardUnit& root, bool enabled) {
  sharded_root(root, "set_requires_gradient_sync").tree()->grad_sync = enabled;
}

void reshard(FullyShardUnit& root) { sharded_root(root, "reshard").tree()->reshard_all(); }

torch::OrderedDict<std::string, at::Tensor> full_state_dict(FullyShardUnit& root) {
  detail::FsdpUnit& state = sharded_root(root, "full_state_dict");
  const auto index = param_index(state);
  torch::OrderedDict<std::string, at::Tensor> out;
  at::NoGradGuard no_grad;
  for (const auto& item : root.unit_module().named_parameters(/*recurse=*/true)) {
    auto it = index.find(item.value().unsafeGetTensorImpl());
    out.insert(item.key(), it->second.first->gather_full(it->second.second));
  }
  for (const auto& item : root.unit_module().named_buffers(/*recurse=*/true)) {
    out.insert(item.key(), item.value().detach().clone());
  }
  return out;
}

void load_full_state_dict(FullyShardUnit& root,
                          const torch::OrderedDict<std::string, at::Tensor>& state) {
  detail::FsdpUnit& s = sharded_root(root, "load_full_state_dict");
  const auto index = param_index(s);
  torch::nn::Module& m = root.unit_module();
  const auto params = m.named_parameters(/*recurse=*/true);
  const auto buffers = m.named_buffers(/*recurse=*/true);
  // Everything checked before anything is written (PyTorch's strict load).
  auto check = [&](const std::string& name, c10::IntArrayRef want) {
    const at::Tensor* value = state.find(name);
    if (value == nullptr || value->sizes() != want) {
      throw InvalidArgument(fmt::format(
          "load_full_state_dict: '{}' is {} in the state dict but the model's is {}: load a "
          "state dict of this model (full_state_dict gives one); nothing was loaded",
          name, value ? c10::str(value->sizes()) : std::string("missing"), c10::str(want)));
    }
  };
  for (const auto& item : params) {
    auto [unit, i] = index.at(item.value().unsafeGetTensorImpl());
    check(item.key(), unit->params()[i].layout.full_sizes);
  }
  for (const auto& item : buffers) check(item.key(), item.value().sizes());
  for (const auto& item : state) {
    if (!params.contains(item.key()) && !buffers.contains(item.key())) {
      throw InvalidArgument(fmt::format(
          "load_full_state_dict: the state dict has '{}', which the model does not: load a "
          "state dict of this model (full_state_dict gives one); nothing was loaded",
          item.key()));
    }
  }
  // Gathered parameters would keep their old values until the next reshard.
  s.tree()->reshard_all();
  at::NoGradGuard no_grad;
  for (const auto& item : params) {
    auto [unit, i] = index.at(item.value().unsafeGetTensorImpl());
    detail::FsdpParam& p = unit->params()[i];
    const detail::ParamShard& l = p.layout;
    if (l.local_numel() == 0) continue;
    const int64_t first = unit->group()->rank() * l.chunk_rows;
    p.shard.view({l.local_rows, l.row_numel})
        .copy_(state[item.key()].reshape({l.rows, l.row_numel}).narrow(0, first, l.local_rows));
  }
  for (const auto& item : buffers) item.value().copy_(state[item.key()]);
}

double clip_grad_norm_(FullyShardUnit& root, double max_norm, double norm_type) {
  detail::FsdpUnit& s = sharded_root(root, "clip_grad_norm_");
  const bool inf = std::isinf(norm_type);
  if (!inf && norm_type != 2.0) {
    throw InvalidArgument(fmt::format(
        "clip_grad_norm_: norm_type {} is not supported: use 2 or infinity", norm_type));
  }
  std::vector<at::Tensor> grads;
  for (const auto& w : s.tree()->units) {
    for (const auto& p : w.lock()->params()) {
      if (p.param.grad().defined()) grads.push_back(p.param.grad());
    }
  }
  at::NoGradGuard no_grad;
  at::Tensor local = at::zeros({1}, at::kDouble);
  for (const at::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    at::Tensor gd = g.to(at::kDouble);
    local = inf ? at::maximum(local, gd.abs().max().reshape({1})) : local + gd.pow(2).sum();
  }
  all_reduce(local, inf ? ReduceOp::MAX : ReduceOp::SUM, {s.group()});
  const double total = inf ? local.item<double>() : std::sqrt(local.item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (at::Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace ddp
