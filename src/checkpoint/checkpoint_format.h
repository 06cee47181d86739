// Internal: the byte layout of checkpoints (see include/ddp/checkpoint.h);
// the fields and tensors through byte_codec.h, the optimizer's state through
// optimizer_state.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "byte_codec.h"
#include "ddp/checkpoint.h"

namespace ddp {
namespace detail {

// The checkpoint as file bytes (the format of include/ddp/checkpoint.h).
std::string serialize_checkpoint(const Checkpoint& ckpt);
// Parses checkpoint bytes (a file's content); `source` names them in errors.
// Survives arbitrary bytes (fuzz/checkpoint_fuzzer.cc): every failure is an
// InvalidArgument naming `source` and the offset.
Checkpoint parse_checkpoint(const std::string& bytes, const std::string& source,
                            const c10::Device& device = c10::Device(c10::kCPU));

void write_rng(ByteWriter& w, const RngState& s);
RngState read_rng(ByteReader& r);

// The calling process's generator states (CPU, and every CUDA device when
// libtorch has CUDA), and setting them back.
RngState capture_rng();
void restore_rng(const RngState& s, const std::string& source);

}  // namespace detail
}  // namespace ddp
