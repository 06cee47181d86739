// Precompiled header shared by libddp, its tests and tools: the libtorch
// headers almost every translation unit needs. Keeping them here costs one
// ~15 s compile instead of ~10 s in each file (ddp_use_pch() in the
// top-level CMakeLists.txt shares it).
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>
