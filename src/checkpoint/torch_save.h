// The bytes of Python's torch.save(state_dict) for a dict of named tensors,
// written by libtorch's own pickler and zip writer, in a form that
// torch.load accepts with weights_only=True (the default since PyTorch 2.6).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <string>
#include <vector>

namespace ddp::detail {

// `state` maps names ("fc1.weight") to tensors on any device (copied to
// CPU for writing). The result is torch.save's zip layout (data.pkl,
// data/0, ...). Unlike torch::pickle_save, the dict is pickled without
// TorchScript's type tags (torch.jit._pickle.restore_type_tag), which
// torch.load's weights-only unpickler refuses: Python reads a plain dict of
// tensors, as torch.save(model.state_dict()) would give it.
std::vector<char> torch_save_bytes(const torch::OrderedDict<std::string, at::Tensor>& state);

}  // namespace ddp::detail
