# Finds libtorch and everything that must match it exactly.
#
# Which libtorch: whatever find_package(Torch) finds, steered as PyTorch
# documents it (CMAKE_PREFIX_PATH=<torch.utils.cmake_prefix_path>, Torch_DIR
# or Torch_ROOT). scripts/setup.sh passes the project venv's torch 2.13 by
# default and Debian's libtorch-dev 1.13 with DDP_TORCH=debian (README,
# "Which libtorch").
#
# Sets:
#   DDP_TORCH_VERSION   e.g. 2.14.1, 2.13.0 or 1.13.1
#   DDP_CUDA, DDP_CUDA_INCLUDE_DIRS, DDP_WITH_NCCL  (cmake/ddp_cuda.cmake)
#   DDP_FMT             the fmt target every ddp target links (see below)
#   DDP_GLOO_INCLUDE_DIR  Gloo's headers, for src/compat/gloo_backend.cc only
#   DDP_PYTHON          the Python whose torch is this libtorch: the oracle of
#                       the tests and the anchor of the benchmarks ("" if none)

include(${CMAKE_CURRENT_LIST_DIR}/ddp_cuda.cmake)
ddp_cuda_before_torch()  # a CUDA libtorch's package needs the toolkit and nvrtc found
find_package(Torch REQUIRED)
if(DEFINED kineto_LIBRARY AND NOT kineto_LIBRARY)
  # TorchConfig.cmake's "static library kineto_LIBRARY-NOTFOUND not found"
  # just above: docs/compat.md, "configure warnings".
  message(STATUS "libtorch: the kineto warning above is harmless: PyTorch's profiler "
                 "library is not shipped in its wheels, and ddp does not use it")
endif()

# --- one libtorch, not two ---------------------------------------------------
# TorchConfig.cmake looks for libc10 (and libtorch, for its message) with
# find_library, whose system paths come before its hint: where Debian's
# libtorch-dev is installed, a wheel's config would link /usr/lib's libc10 of
# 1.13 next to the wheel's libtorch. Search the config's own prefix first
# (Torch_ROOT, CMP0074) and refuse any library outside it.
function(_ddp_torch_stray_libraries out)
  set(stray "")
  get_filename_component(prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
  foreach(lib ${c10_LIBRARY} ${TORCH_LIBRARY} ${kineto_LIBRARY})
    get_filename_component(real "${lib}" REALPATH)
    string(FIND "${real}" "${prefix}/" at)
    if(lib AND NOT at EQUAL 0)  # (a library not found at all is TorchConfig's warning)
      list(APPEND stray "${lib}")
    endif()
  endforeach()
  set(${out} "${stray}" PARENT_SCOPE)
endfunction()

_ddp_torch_stray_libraries(_ddp_stray)
if(_ddp_stray)
  message(STATUS "libtorch: ${_ddp_stray} lie outside ${TORCH_INSTALL_PREFIX}; searching that prefix first")
  unset(c10_LIBRARY CACHE)
  unset(TORCH_LIBRARY CACHE)
  unset(kineto_LIBRARY CACHE)
  set(Torch_ROOT "${TORCH_INSTALL_PREFIX}")
  find_package(Torch REQUIRED)
  _ddp_torch_stray_libraries(_ddp_stray)
  if(_ddp_stray)
    message(FATAL_ERROR
      "libtorch: TorchConfig.cmake in ${TORCH_INSTALL_PREFIX} resolved "
      "${_ddp_stray} from another installation. Two libtorch builds in one "
      "program crash at run time. Point Torch_ROOT at one installation, or "
      "remove the other (apt-get remove libtorch-dev).")
  endif()
endif()

# The headers' own version (Debian's TorchConfigVersion says 1.13.0 for
# 1.13.1); 2.x moved the numbers to torch/headeronly/version.h.
set(DDP_TORCH_VERSION "${Torch_VERSION}")
foreach(dir ${TORCH_INCLUDE_DIRS})
  foreach(file torch/headeronly/version.h torch/version.h)
    if(EXISTS "${dir}/${file}")
      file(READ "${dir}/${file}" _vh)
      if(_vh MATCHES "TORCH_VERSION_MAJOR ([0-9]+).*TORCH_VERSION_MINOR ([0-9]+).*TORCH_VERSION_PATCH ([0-9]+)")
        set(DDP_TORCH_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
      endif()
    endif()
  endforeach()
endforeach()
message(STATUS "libtorch ${DDP_TORCH_VERSION} in ${TORCH_INSTALL_PREFIX}")
ddp_cuda_after_torch()  # DDP_CUDA, DDP_CUDA_INCLUDE_DIRS, DDP_WITH_NCCL

# --- libstdc++ ahead of libtorch ---------------------------------------------
# Note [remove_all and libtorch 2.11] (src/compat/filesystem_compat.h):
# PyTorch 2.11's libtorch.so exports a copy of std::filesystem::remove_all
# that calls recursive_directory_iterator::__erase through a weak reference,
# null where the system's libstdc++ lacks it: the call jumps to address 0
# (pytorch#133437). A program that loads libstdc++ before libtorch binds the
# name to libstdc++'s own, so where one of libtorch's libraries exports
# remove_all together with that weak reference, every program linked with
# ddp::ddp (ddp's tools and tests, and the user's) names libstdc++ first
# (DDP_LIBSTDCXX_FIRST, used in src/CMakeLists.txt). The copies without the
# weak reference (2.13's and 2.14's libtorch_cpu.so) make no such call and
# change nothing. ddp's own code does not rely on this: it never calls
# remove_all.
set(DDP_LIBSTDCXX_FIRST OFF)
find_program(DDP_GREP grep)
if(CMAKE_NM AND DDP_GREP AND CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
  file(GLOB _ddp_torch_libs "${TORCH_INSTALL_PREFIX}/lib/libtorch*.so"
                            "${TORCH_INSTALL_PREFIX}/lib/libc10*.so")
  foreach(_ddp_lib IN LISTS _ddp_torch_libs)
    execute_process(COMMAND "${CMAKE_NM}" -D "${_ddp_lib}"
                    COMMAND "${DDP_GREP}" -E " [TW] _ZNSt10filesystem10remove_all| [wv] _ZNSt10filesystem.*recursive_directory_iterator7__erase"
                    OUTPUT_VARIABLE _ddp_syms ERROR_QUIET)
    if(_ddp_syms MATCHES " [TW] _ZNSt10filesystem10remove_all" AND _ddp_syms MATCHES " [wv] _ZNSt10filesystem")
      set(DDP_LIBSTDCXX_FIRST ON)
      message(STATUS "libtorch: ${_ddp_lib} exports a std::filesystem::remove_all that can jump "
                     "to address 0 (pytorch#133437); programs linked with ddp::ddp load libstdc++ first")
    endif()
  endforeach()
endif()

# --- fmt ---------------------------------------------------------------------
# libtorch 2.x ships fmt's headers (fmt 12 in 2.13) in its include directory,
# and c10d's own headers include them. That directory comes before
# /usr/include on every compile line, so <fmt/format.h> is torch's fmt there
# whatever we do, and linking Debian's libfmt (fmt 9) would mix two versions.
# So, with such a libtorch, ddp uses exactly the fmt torch ships, header-only
# (libtorch keeps its compiled fmt internal). Without one (Debian's 1.13),
# the system's fmt library.
set(_ddp_torch_fmt "")
foreach(dir ${TORCH_INCLUDE_DIRS})
  # (Debian's libtorch-dev puts its headers in /usr/include, beside the
  # system's fmt: that is not a bundled copy.)
  if(NOT _ddp_torch_fmt AND EXISTS "${dir}/fmt/format.h"
     AND NOT dir MATCHES "^/usr(/local)?/include/?$")
    set(_ddp_torch_fmt "${dir}")
  endif()
endforeach()
if(_ddp_torch_fmt)
  add_library(ddp_fmt INTERFACE)
  target_include_directories(ddp_fmt SYSTEM INTERFACE "${_ddp_torch_fmt}")
  target_compile_definitions(ddp_fmt INTERFACE FMT_HEADER_ONLY)
  set(DDP_FMT ddp_fmt)
  set(DDP_FMT_HEADER_ONLY ON)
  message(STATUS "fmt: libtorch's own, header-only (${_ddp_torch_fmt}/fmt)")
else()
  find_package(fmt REQUIRED)
  set(DDP_FMT fmt::fmt)
  set(DDP_FMT_HEADER_ONLY OFF)
endif()

# --- Gloo's headers ----------------------------------------------------------
# c10d's ProcessGroupGloo.hpp includes Gloo's headers, which PyTorch's wheels
# and LibTorch archives do not ship. Only src/compat/gloo_backend.cc includes
# it, and only to call functions compiled inside libtorch; Note [Gloo headers]
# in that file says why any Gloo's declarations are then safe, and the
# gloo_backend_abi test checks its object code for the proof.
find_path(DDP_GLOO_INCLUDE_DIR gloo/algorithm.h
  HINTS ${TORCH_INCLUDE_DIRS}
  DOC "Directory holding gloo/algorithm.h (Debian: libgloo-dev)")
if(NOT DDP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR
    "Gloo's headers (gloo/algorithm.h) are missing: c10d's ProcessGroupGloo.hpp "
    "needs them and ${TORCH_INSTALL_PREFIX} does not ship them. Install them "
    "(Debian/Ubuntu: apt-get install libgloo-dev), or point "
    "-DDDP_GLOO_INCLUDE_DIR=<dir> at a Gloo checkout's source root.")
endif()

# --- the oracle --------------------------------------------------------------
# The Python whose `torch` is this very libtorch (same version): a venv's
# python next to a wheel, /usr/bin/python3 next to Debian's libtorch-dev.
set(DDP_PYTHON "" CACHE FILEPATH "Python with the torch matching this libtorch (tests' oracle)")
if(NOT DDP_PYTHON)
  get_filename_component(_venv "${TORCH_INSTALL_PREFIX}/../../../.." ABSOLUTE)
  foreach(candidate "${_venv}/bin/python3" /usr/bin/python3)
    if(NOT DDP_PYTHON AND EXISTS "${candidate}")
      execute_process(
        COMMAND "${candidate}" -c "import torch; print(torch.__version__.split('+')[0])"
        OUTPUT_VARIABLE _pv OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _rc ERROR_QUIET TIMEOUT 120)
      if(_rc EQUAL 0 AND _pv STREQUAL DDP_TORCH_VERSION)
        set(DDP_PYTHON "${candidate}" CACHE FILEPATH
            "Python with the torch matching this libtorch (tests' oracle)" FORCE)
      endif()
    endif()
  endforeach()
endif()
if(DDP_PYTHON)
  message(STATUS "oracle: ${DDP_PYTHON} (torch ${DDP_TORCH_VERSION})")
else()
  message(STATUS "oracle: no Python with torch ${DDP_TORCH_VERSION}; Python comparisons will be skipped")
endif()
