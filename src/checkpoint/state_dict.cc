#include "ddp/state_dict.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_files.h"
#include "ddp/error.h"
#include "tensor_text.h"
#include "torch_load.h"
#include "torch_save.h"

namespace ddp {
namespace {

// Python's state_dict order: a module's own parameters, its own buffers,
// then each child's, depth first; names joined with '.'.
void collect(const torch::nn::Module& module, const std::string& prefix,
             torch::OrderedDict<std::string, at::Tensor>& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    out.insert(prefix + p.key(), p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) out.insert(prefix + b.key(), b.value());
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix + child.key() + ".", out);
  }
}

torch::OrderedDict<std::string, at::Tensor> module_state(const torch::nn::Module& module) {
  torch::OrderedDict<std::string, at::Tensor> out;
  collect(module, "", out);
  return out;
}

bool all_start_with(const torch::OrderedDict<std::string, at::Tensor>& d,
                    const std::string& prefix) {
  if (d.is_empty()) return false;
  for (const auto& item : d) {
    if (item.key().compare(0, prefix.size(), prefix) != 0) return false;
  }
  return true;
}

std::string quoted(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "\"" : ", \"") + k + "\"";
  return out;
}

std::string error_text(const torch::nn::Module& module, const std::string& source,
                       const IncompatibleKeys& keys, const std::vector<std::string>& sizes,
                       bool strict) {
  std::string text = fmt::format("Error(s) in loading state_dict for {}{}:", module.name(),
                                 source.empty() ? "" : " from '" + source + "'");
  if (strict && !keys.missing_keys.empty()) {
    text += "\n\tMissing key(s) in state_dict: " + quoted(keys.missing_keys) + ".";
  }
  if (strict && !keys.unexpected_keys.empty()) {
    text += "\n\tUnexpected key(s) in state_dict: " + quoted(keys.unexpected_keys) + ".";
  }
  for (const auto& s : sizes) text += "\n\t" + s;
  text += "\nThe module's keys are its register_module/register_parameter names, which must "
          "be the Python attribute names";
  if (strict) text += "; StateDictOptions::strict = false loads the keys both have";
  return text;
}

IncompatibleKeys load_into(torch::nn::Module& module,
                           const torch::OrderedDict<std::string, at::Tensor>& file,
                           const StateDictOptions& options, const std::string& source) {
  auto own = module_state(module);
  std::string prefix;
  if (all_start_with(file, "module.") && !all_start_with(own, "module.")) prefix = "module.";
  IncompatibleKeys keys;
  std::vector<std::string> sizes;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (into, from)
  for (const auto& item : own) {
    const at::Tensor* saved = file.find(prefix + item.key());
    if (saved == nullptr) {
      keys.missing_keys.push_back(item.key());
    } else if (saved->sizes() != item.value().sizes()) {
      sizes.push_back(fmt::format(
          "size mismatch for {}: copying a param with shape {} from checkpoint, the shape in "
          "current model is {}.",
          item.key(), detail::describe_tensor(*saved), detail::describe_tensor(item.value())));
    } else {
      copies.emplace_back(item.value(), *saved);
    }
  }
  for (const auto& item : file) {
    if (!own.contains(item.key().substr(prefix.size()))) {
      keys.unexpected_keys.push_back(item.key());
    }
  }
  const bool strict_failure =
      options.strict && (!keys.missing_keys.empty() || !keys.unexpected_keys.empty());
  if (strict_failure || !sizes.empty()) {
    throw InvalidArgument(error_text(module, source, keys, sizes, options.strict));
  }
  torch::NoGradGuard no_grad;
  for (auto& [into, from] : copies) into.copy_(from);
  return keys;
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> read_state_dict(const std::string& path,
                                                            const std::string& key) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InvalidArgument(fmt::format("state dict file '{}' {}", path,
                                      std::filesystem::exists(path, ec)
                                          ? "is not a regular file"
                                          : "does not exist"));
  }
  return detail::parse_torch_state_dict(detail::read_whole_file(path), path, key);
}

IncompatibleKeys load_state_dict(torch::nn::Module& module,
                                 const torch::OrderedDict<std::string, at::Tensor>& state,
                                 const StateDictOptions& options) {
  return load_into(module, state, options, "");
}

IncompatibleKeys load_state_dict(torch::nn::Module& module, const std::string& path,
                                 const StateDictOptions& options) {
  return load_into(module, read_state_dict(path, options.key), options, path);
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InvalidArgument(fmt::format("cannot write state dict '{}': its directory '{}' does "
                                      "not exist",
                                      path, dir));
  }
  std::vector<char> bytes = detail::torch_save_bytes(module_state(module));
  detail::write_file_atomically(dir, p.filename().string(), bytes.data(), bytes.size());
}

}  // namespace ddp
