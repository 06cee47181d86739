// Reading Python's torch.save(model.state_dict()) files: the zip archive
// (PyTorch >= 1.6's default) through libtorch's PyTorchStreamReader, its
// data.pkl through ddp's restricted unpickler (unpickler.h), its storages
// from data/<key>. The inverse of torch_save.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <string>

namespace ddp::detail {

// The named tensors of the dict torch.save wrote into `bytes`, on the CPU,
// in the file's order (`key` non-empty: of the dict under that key of the
// saved dict, as in torch.save({"model": m.state_dict(), "epoch": 3})).
// Storages shared by several tensors stay shared; every dtype of a state
// dict is read (float, double, half, bfloat16, complex, integers, bool).
// Throws InvalidArgument naming `source` and what it holds instead: not a
// zip (the legacy format), a TorchScript archive, a Python object other
// than a dict of tensors (a whole nn.Module), a dict whose values are not
// tensors (naming its keys and suggesting `key`), a storage record missing
// or shorter than its tensors, a big-endian file, a malformed pickle.
// Survives arbitrary bytes (fuzzed: fuzz/torch_load_fuzzer.cc).
torch::OrderedDict<std::string, at::Tensor> parse_torch_state_dict(const std::string& bytes,
                                                                   const std::string& source,
                                                                   const std::string& key);

}  // namespace ddp::detail
