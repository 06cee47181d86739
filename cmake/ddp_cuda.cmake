# CUDA libtorch: what TorchConfig.cmake needs before it runs, and what ddp
# needs after. Included by cmake/ddp_torch.cmake.
#
# A CUDA libtorch's CMake package runs FindCUDA and enable_language(CUDA):
# it needs the CUDA toolkit (nvcc), libnvrtc, and, for the headers ddp
# includes (ATen/cuda/CUDAContext.h: cuBLAS, cuSPARSE, cuSOLVER; c10d's
# ProcessGroupNCCL.hpp: nccl.h), headers a bare toolkit may lack. PyPI's
# CUDA wheels carry all of them in site-packages/nvidia/*/ (cu13/ for CUDA
# 13, cuda_*/ and cublas/ ... for CUDA 12): ddp looks there first, then in
# the toolkit. Everything can be given by hand instead (README, "Which
# libtorch"): CUDA_TOOLKIT_ROOT_DIR, CUDA_nvrtc_LIBRARY, DDP_CUDA_INCLUDE_DIRS,
# DDP_NCCL_INCLUDE_DIR.
#
# ddp_cuda_before_torch() sets, when the libtorch to be found has CUDA:
#   CUDA_TOOLKIT_ROOT_DIR  ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda, nvcc's)
#   CUDA_nvrtc_LIBRARY     (the toolkit's, else the wheel's)
# ddp_cuda_after_torch() sets:
#   DDP_CUDA               ON for a CUDA libtorch
#   DDP_CUDA_INCLUDE_DIRS  headers for translation units that include
#                          ATen/cuda or c10d's NCCL headers
#   DDP_WITH_NCCL          ON/OFF (AUTO: ON when c10d's NCCL header and
#                          nccl.h are both there)

# The libtorch root that find_package(Torch) will take: the directory of
# TorchConfig.cmake, three levels up (torch/share/cmake/Torch).
function(_ddp_torch_root out)
  find_path(_ddp_torch_config_dir TorchConfig.cmake
    HINTS ${Torch_DIR} $ENV{Torch_DIR}
    PATH_SUFFIXES share/cmake/Torch Torch
    NO_SYSTEM_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH)
  set(root "")
  if(_ddp_torch_config_dir)
    get_filename_component(root "${_ddp_torch_config_dir}/../../.." ABSOLUTE)
  endif()
  unset(_ddp_torch_config_dir CACHE)
  set(${out} "${root}" PARENT_SCOPE)
endfunction()

# The wheel's nvidia/ packages beside torch/ (empty outside a wheel).
function(_ddp_nvidia_dirs torch_root out)
  file(GLOB dirs LIST_DIRECTORIES true "${torch_root}/../nvidia/*")
  set(${out} "${dirs}" PARENT_SCOPE)
endfunction()

macro(ddp_cuda_before_torch)
  _ddp_torch_root(_ddp_root)
  if(_ddp_root AND EXISTS "${_ddp_root}/lib/libtorch_cuda.so")
    if(NOT CUDA_TOOLKIT_ROOT_DIR)
      set(_ddp_candidates "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
      find_program(_ddp_nvcc nvcc)
      if(_ddp_nvcc)
        get_filename_component(_ddp_nvcc_real "${_ddp_nvcc}" REALPATH)
        get_filename_component(_ddp_nvcc_root "${_ddp_nvcc_real}/../.." ABSOLUTE)
        list(APPEND _ddp_candidates "${_ddp_nvcc_root}")
      endif()
      unset(_ddp_nvcc CACHE)
      foreach(dir ${_ddp_candidates})
        if(NOT CUDA_TOOLKIT_ROOT_DIR AND dir AND EXISTS "${dir}/bin/nvcc"
           AND EXISTS "${dir}/include/cuda_runtime.h")
          set(CUDA_TOOLKIT_ROOT_DIR "${dir}" CACHE PATH "CUDA toolkit (nvcc) for the CUDA libtorch")
        endif()
      endforeach()
      if(NOT CUDA_TOOLKIT_ROOT_DIR)
        message(FATAL_ERROR
          "libtorch in ${_ddp_root} is built with CUDA, and its CMake package "
          "needs the CUDA toolkit (nvcc, cuda_runtime.h), which was not found in "
          "$CUDA_HOME, $CUDA_PATH, /usr/local/cuda or beside the nvcc on PATH. "
          "Install the toolkit of the libtorch's CUDA version, or pass "
          "-DCUDA_TOOLKIT_ROOT_DIR=<dir holding bin/nvcc>.")
      endif()
    endif()
    if(NOT CUDA_nvrtc_LIBRARY)
      _ddp_nvidia_dirs("${_ddp_root}" _ddp_nv)
      set(_ddp_hints "${CUDA_TOOLKIT_ROOT_DIR}/lib64" "${CUDA_TOOLKIT_ROOT_DIR}/lib")
      foreach(dir ${_ddp_nv})
        list(APPEND _ddp_hints "${dir}/lib")
      endforeach()
      find_library(CUDA_nvrtc_LIBRARY
        NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12
        HINTS ${_ddp_hints} "${_ddp_root}/lib" NO_DEFAULT_PATH)
      if(NOT CUDA_nvrtc_LIBRARY)
        message(FATAL_ERROR
          "libtorch in ${_ddp_root} links libnvrtc, found neither in the CUDA "
          "toolkit (${CUDA_TOOLKIT_ROOT_DIR}) nor in the wheel's nvidia/ "
          "packages. Pass -DCUDA_nvrtc_LIBRARY=<path to libnvrtc.so>.")
      endif()
    endif()
  endif()
endmacro()

macro(ddp_cuda_after_torch)
  set(DDP_CUDA OFF)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libtorch_cuda.so")
    set(DDP_CUDA ON)
  endif()

  set(DDP_CUDA_INCLUDE_DIRS "" CACHE STRING
      "Extra CUDA headers (cuBLAS, cuSPARSE, nccl.h) for a CUDA libtorch; found in the wheel by default")
  set(DDP_WITH_NCCL AUTO CACHE STRING
      "The NCCL backend: ON, OFF, or AUTO (ON with a CUDA libtorch whose c10d has NCCL)")
  set_property(CACHE DDP_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)

  if(DDP_CUDA)
    _ddp_nvidia_dirs("${TORCH_INSTALL_PREFIX}" _ddp_nv)
    if(NOT DDP_CUDA_INCLUDE_DIRS)
      set(_ddp_inc "")
      # The toolkit's own first; the wheel's packages fill in what it lacks.
      foreach(dir "${CUDA_TOOLKIT_ROOT_DIR}/include" ${_ddp_nv})
        if(IS_DIRECTORY "${dir}/include")
          list(APPEND _ddp_inc "${dir}/include")
        elseif(IS_DIRECTORY "${dir}" AND dir MATCHES "/include$")
          list(APPEND _ddp_inc "${dir}")
        endif()
      endforeach()
      set(DDP_CUDA_INCLUDE_DIRS "${_ddp_inc}" CACHE STRING
          "Extra CUDA headers (cuBLAS, cuSPARSE, nccl.h) for a CUDA libtorch; found in the wheel by default" FORCE)
    endif()
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${DDP_CUDA_INCLUDE_DIRS}
      DOC "Directory holding nccl.h (a CUDA wheel's nvidia/nccl/include)")
    set(_ddp_c10d_nccl "${TORCH_INSTALL_PREFIX}/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
    if(DDP_WITH_NCCL STREQUAL AUTO)
      if(DDP_NCCL_INCLUDE_DIR AND EXISTS "${_ddp_c10d_nccl}")
        set(DDP_WITH_NCCL ON)
      else()
        set(DDP_WITH_NCCL OFF)
      endif()
    endif()
    message(STATUS "CUDA libtorch: toolkit ${CUDA_TOOLKIT_ROOT_DIR}, nvrtc ${CUDA_nvrtc_LIBRARY}, NCCL ${DDP_WITH_NCCL}")
  elseif(DDP_WITH_NCCL STREQUAL AUTO)
    set(DDP_WITH_NCCL OFF)
  endif()
  if(DDP_WITH_NCCL AND NOT DDP_CUDA)
    message(FATAL_ERROR
      "DDP_WITH_NCCL=ON, but libtorch in ${TORCH_INSTALL_PREFIX} is built "
      "without CUDA (no lib/libtorch_cuda.so). Use a CUDA libtorch, or "
      "-DDDP_WITH_NCCL=OFF (AUTO) for Gloo only.")
  endif()
  if(DDP_WITH_NCCL AND NOT DDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR
      "DDP_WITH_NCCL=ON, but nccl.h was not found (looked in "
      "${DDP_CUDA_INCLUDE_DIRS}). Install NCCL's headers (the nvidia-nccl "
      "wheel of your CUDA version, or libnccl-dev) and pass "
      "-DDDP_NCCL_INCLUDE_DIR=<dir holding nccl.h>.")
  endif()
endmacro()
