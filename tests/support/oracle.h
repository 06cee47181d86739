// The oracle: the Python whose `torch` is the very libtorch this build links
// (CMake's DDP_PYTHON: the project venv's torch 2.13, or Debian's
// /usr/bin/python3 with python3-torch 1.13 for a build on Debian's libtorch).
// Every comparison with PyTorch runs it. Tests skip only when no such Python
// was found at configure time; a configured oracle that fails is a failure.
#pragma once

#include <string>

#ifndef DDP_PYTHON
#define DDP_PYTHON ""
#endif

namespace ddp::testing {

inline std::string oracle_python() { return DDP_PYTHON; }

inline bool oracle_configured() { return !oracle_python().empty(); }

inline const char* kNoOracle =
    "no Python with the torch of this libtorch was found when configuring "
    "(CMake's DDP_PYTHON); the comparison with PyTorch cannot run";

}  // namespace ddp::testing
