// State dicts shared with Python, both ways.
//
// Python to C++: weights trained in Python, saved with
//
//   torch.save(model.state_dict(), "net.pt")          # or {"model": ..., "epoch": 3}
//
// load into the same architecture built with libtorch:
//
//   Net net;                                          // names as in Python: "fc1.weight"
//   ddp::load_state_dict(*net, "net.pt");             // strict, as Python's default
//
// libtorch's own readers refuse such a file: torch::load expects a
// TorchScript archive ("constants.pkl ... corrupted"), torch::pickle_load
// reads the state dict's OrderedDict as None. ddp reads it with a
// restricted unpickler that, like torch.load(weights_only=True), builds
// dicts, lists, tuples, strings, numbers and tensors and refuses every
// other Python object by name; it never runs code from the file.
//
// C++ to Python: ddp::save_state_dict(module, "net.pt") writes what
// torch.save(model.state_dict()) writes, so that Python reads it with
//
//   model.load_state_dict(torch.load("net.pt"))       # weights_only=True is fine
//
// (ddp's checkpoints write the same file beside each checkpoint:
// checkpoint.h's .model.pt.)
//
// Names: libtorch's register_module/register_parameter names must be
// Python's attribute names ("conv1", "fc.weight"); a Sequential's children
// are "0", "1", ... in both. A leading "module." on every key of the file
// (saved from a DistributedDataParallel-wrapped model) is dropped when the
// module's own keys have none, as PyTorch's
// consume_prefix_in_state_dict_if_present would be asked to.
//
// Thread safety: do not run these concurrently with training steps on the
// same module. Local: no communication (every rank reads the file itself,
// or rank 0 reads and ddp::broadcast_parameters shares it).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <string>
#include <vector>

namespace ddp {

struct StateDictOptions {
  // PyTorch's load_state_dict(strict=True): every key of the module must be
  // in the file and every key of the file in the module. false loads the
  // keys both have and returns the others. A shape mismatch is an error
  // either way (as in PyTorch).
  bool strict = true;
  // Non-empty: the state dict is this entry of the saved dict, e.g. "model"
  // for torch.save({"model": model.state_dict(), "optimizer": ...}).
  std::string key;
};

// PyTorch's _IncompatibleKeys: what strict = false let through.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;     // the module's, not in the file
  std::vector<std::string> unexpected_keys;  // the file's, not in the module
};

// The named tensors of a torch.save'd state dict at `path`, on the CPU, in
// the file's order, with their saved dtypes (a CUDA tensor saved in Python
// is read onto the CPU, as torch.load(map_location="cpu")). Reads the zip
// format torch.save writes by default since PyTorch 1.6, written by any
// PyTorch since then. Memory: the file's bytes plus its tensors, at once.
// Throws InvalidArgument naming `path` and what is wrong: missing or
// unreadable; not a zip (torch.save's legacy format: resave it); a
// TorchScript archive (use torch::jit::load); an object other than a dict
// of tensors (a whole nn.Module, naming its class); a dict of other things
// (naming its keys: set `key`); a damaged archive or pickle.
torch::OrderedDict<std::string, at::Tensor> read_state_dict(const std::string& path,
                                                            const std::string& key = "");

// Copies `state` into `module`'s parameters and buffers (recursively, as
// Module::named_parameters/named_buffers name them), in place under
// NoGradGuard, onto each one's own device and dtype (a float64 file into a
// float32 module is cast, as Tensor.copy_ in PyTorch's load_state_dict).
// All or nothing: everything is checked before anything changes.
// Throws InvalidArgument listing, as PyTorch does, the missing and the
// unexpected keys (when strict) and every size mismatch, each by name.
IncompatibleKeys load_state_dict(torch::nn::Module& module,
                                 const torch::OrderedDict<std::string, at::Tensor>& state,
                                 const StateDictOptions& options = {});

// read_state_dict(path, options.key), then load_state_dict; errors name `path`.
IncompatibleKeys load_state_dict(torch::nn::Module& module, const std::string& path,
                                 const StateDictOptions& options = {});

// Writes `module`'s parameters and buffers (CPU copies, their dtypes) as
// torch.save(model.state_dict()) would: a zip that Python's torch.load
// reads, weights_only=True included. Atomic: a temporary file in the same
// directory, fsynced, renamed over `path` (a crash leaves the previous file
// or the new one). Throws InvalidArgument naming `path` when its directory
// is missing or the write fails (a full disk).
void save_state_dict(const torch::nn::Module& module, const std::string& path);

}  // namespace ddp
