// Initial weights shared by both sides of the benchmark: ddp-bench writes a
// model's parameters once (--save-weights), and every run, C++ or Python,
// loads them, so both sides start from the same numbers.
//
// Format, for a path prefix P:
//   P.json  {"tensors": [{"name": "fc1.weight", "shape": [1024, 784],
//                         "offset": 0}, ...]}   (offsets in bytes into P.bin)
//   P.bin   the parameters' float32 values, little-endian, row-major,
//           concatenated in named_parameters() order.
// Both files are written atomically (temporary file, fsync, rename).
#pragma once

#include <torch/nn/module.h>

#include <string>

namespace ddp::bench {

// Writes bytes to path atomically (path.tmp, fsync, rename). Throws
// ddp::InvalidArgument naming the path when it cannot.
void write_atomically(const std::string& path, const std::string& bytes);

// Writes module's parameters (float32, CPU) to prefix.json / prefix.bin.
// Throws ddp::InvalidArgument if a file cannot be written (naming it).
void save_weights(const torch::nn::Module& module, const std::string& prefix);

// Copies the saved values into module's parameters. Throws
// ddp::InvalidArgument naming the file and the parameter when the files are
// missing or a name or shape differs from the module's.
void load_weights(torch::nn::Module& module, const std::string& prefix);

}  // namespace ddp::bench
