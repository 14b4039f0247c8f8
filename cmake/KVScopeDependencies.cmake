# Every third-party dependency is found here, once, and wrapped in a target
# whose name says what it is. scripts/setup-deps installs all of them.

find_package(Threads REQUIRED)

# HDF5 (C API; core/trace wraps it in RAII handles).
find_package(HDF5 REQUIRED COMPONENTS C)
add_library(kvscope_hdf5 INTERFACE)
target_include_directories(kvscope_hdf5 SYSTEM INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(kvscope_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(kvscope_hdf5 INTERFACE ${HDF5_DEFINITIONS} H5_USE_110_API)
message(STATUS "HDF5 ${HDF5_VERSION}: ${HDF5_C_LIBRARIES}")

find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
# toml11 (header-only): sweep plans (app/cli/engine/sweep_plan.cpp).
find_package(toml11 3.7 REQUIRED)
# PCRE2 (8-bit): the tokenizers' pre-split regexes (capture/tokenizer).
# pkg-config when it knows libpcre2-8; otherwise (a machine with no
# pkg-config or no libpcre2-8.pc, e.g. a GPU box built against the prefix of
# bench/gpu/make-sysroot.sh) find_path/find_library over CMAKE_PREFIX_PATH or
# PCRE2_ROOT. Both give the one target capture/ links, PkgConfig::PCRE2.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
if(TARGET PkgConfig::PCRE2)
  message(STATUS "PCRE2 ${PCRE2_VERSION} (pkg-config): ${PCRE2_LINK_LIBRARIES}")
else()
  find_path(PCRE2_INCLUDE_DIR pcre2.h HINTS ${PCRE2_ROOT} $ENV{PCRE2_ROOT} PATH_SUFFIXES include)
  find_library(PCRE2_LIBRARY pcre2-8 HINTS ${PCRE2_ROOT} $ENV{PCRE2_ROOT} PATH_SUFFIXES lib)
  if(NOT PCRE2_INCLUDE_DIR OR NOT PCRE2_LIBRARY)
    message(FATAL_ERROR "PCRE2 (libpcre2-8) not found: install libpcre2-dev, or pass "
                        "-DPCRE2_ROOT=<prefix> (or -DPCRE2_INCLUDE_DIR and -DPCRE2_LIBRARY)")
  endif()
  add_library(PkgConfig::PCRE2 UNKNOWN IMPORTED)
  set_target_properties(PkgConfig::PCRE2 PROPERTIES
    IMPORTED_LOCATION "${PCRE2_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
  message(STATUS "PCRE2 (no pkg-config): ${PCRE2_LIBRARY}")
endif()
# ICU (uc): Unicode normalization and character classes for the tokenizers.
find_package(ICU REQUIRED COMPONENTS uc)

# LibTorch: KVSCOPE_TORCH (set by scripts/build) says which. pip: the one
# CMAKE_PREFIX_PATH names (scripts/setup-torch prints it); debian: Debian's
# libtorch-dev, whatever the prefix path holds. Empty: whichever LibTorch
# find_package finds first (CMAKE_PREFIX_PATH, then the system's).
set(KVSCOPE_TORCH "" CACHE STRING "Which LibTorch: pip (the prefix CMAKE_PREFIX_PATH names) or debian (libtorch-dev)")
set_property(CACHE KVSCOPE_TORCH PROPERTY STRINGS "" pip debian)
if(NOT KVSCOPE_TORCH MATCHES "^(|pip|debian)$")
  message(FATAL_ERROR "KVSCOPE_TORCH=${KVSCOPE_TORCH}: expected pip or debian")
endif()
# A CUDA build of LibTorch (pip's torch) adds nvcc -gencode flags for the GPUs
# it autodetects, or for a list from Maxwell on when there is none; CUDA 13's
# nvcc rejects compute_50. Our kernels target Ampere and Hopper (sm_80, sm_90).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
if(KVSCOPE_TORCH STREQUAL "debian")
  set(Torch_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch" CACHE PATH "" FORCE)
else()
  find_file(KVSCOPE_TORCH_CONFIG TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH}
            PATH_SUFFIXES Torch share/cmake/Torch NO_DEFAULT_PATH)
  if(KVSCOPE_TORCH STREQUAL "pip" AND NOT KVSCOPE_TORCH_CONFIG)
    message(FATAL_ERROR "KVSCOPE_TORCH=pip, but no TorchConfig.cmake in CMAKE_PREFIX_PATH "
                        "('${CMAKE_PREFIX_PATH}'): pass -DCMAKE_PREFIX_PATH=$(scripts/setup-torch)")
  endif()
endif()
# LibTorch's config looks its libraries up with find_library(... PATHS
# <its prefix>/lib), which searches the system folders first: with Debian's
# libtorch-dev installed, pip's torch got Debian's libc10. Pin them to the
# LibTorch CMAKE_PREFIX_PATH names before its config runs.
if(KVSCOPE_TORCH_CONFIG)
  get_filename_component(_kvscope_torch_prefix "${KVSCOPE_TORCH_CONFIG}/../../../.." ABSOLUTE)
  foreach(_pair c10_LIBRARY:c10 kineto_LIBRARY:kineto C10_CUDA_LIBRARY:c10_cuda TORCH_LIBRARY:torch)
    string(REPLACE ":" ";" _pair "${_pair}")
    list(GET _pair 0 _var)
    list(GET _pair 1 _name)
    find_library(${_var} ${_name} PATHS "${_kvscope_torch_prefix}/lib" NO_DEFAULT_PATH)
  endforeach()
endif()
find_package(Torch REQUIRED)
if(KVSCOPE_TORCH_CONFIG)
  # pip's CUDA torch finds NCCL, cuDNN, cuBLAS... in the nvidia-* packages
  # beside it (its RPATH). At link time ld would take the CUDA toolkit's
  # older copies from our own -rpath first (undefined ncclPutSignal): name
  # the packaged ones for resolving LibTorch's dependencies.
  file(GLOB _kvscope_nvidia_libs "${_kvscope_torch_prefix}/../nvidia/*/lib")
  foreach(_dir IN LISTS _kvscope_nvidia_libs)
    add_link_options("LINKER:-rpath-link,${_dir}")
  endforeach()
endif()
add_library(kvscope_torch INTERFACE)
target_link_libraries(kvscope_torch INTERFACE ${TORCH_LIBRARIES})
separate_arguments(_kvscope_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(kvscope_torch INTERFACE ${_kvscope_torch_flags})
# LibTorch's headers need C++20 from torch 2.10 on, but only recent
# TorchConfigs put cxx_std_20 on their torch target: say it here too.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.10)
  target_compile_features(kvscope_torch INTERFACE cxx_std_20)
endif()
message(STATUS "LibTorch ${Torch_VERSION}: ${TORCH_INSTALL_PREFIX}")
# One LibTorch per process: every c10/torch library LibTorch's config hands
# us must lie in its own install. A build against pip's torch on a machine
# with Debian's libtorch-dev once linked Debian's libc10 beside pip's
# libtorch_cpu and aborted at start-up (2026-11-21).
get_filename_component(_kvscope_torch_root "${TORCH_INSTALL_PREFIX}" REALPATH)
set(_kvscope_torch_files "")
foreach(_lib IN LISTS TORCH_LIBRARIES)
  if(TARGET ${_lib})
    foreach(_prop IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG)
      get_target_property(_loc ${_lib} ${_prop})
      if(_loc)
        list(APPEND _kvscope_torch_files "${_loc}")
      endif()
    endforeach()
  elseif(EXISTS "${_lib}")
    list(APPEND _kvscope_torch_files "${_lib}")
  endif()
endforeach()
foreach(_file IN LISTS _kvscope_torch_files)
  get_filename_component(_name "${_file}" NAME)
  get_filename_component(_real "${_file}" REALPATH)
  if(_name MATCHES "^lib(c10|torch)" AND NOT _real MATCHES "^${_kvscope_torch_root}/")
    message(FATAL_ERROR "Two LibTorch installs would meet: ${_file} is not part of the LibTorch "
                        "found at ${TORCH_INSTALL_PREFIX}. Point CMAKE_PREFIX_PATH at one LibTorch "
                        "only (scripts/build chooses it; see README, 'LibTorch').")
  endif()
endforeach()

if(KVSCOPE_BUILD_GUI)
  find_package(Qt6 6.2 REQUIRED COMPONENTS Core Gui Widgets Svg PrintSupport Concurrent)
  if(KVSCOPE_BUILD_TESTS)
    find_package(Qt6 6.2 REQUIRED COMPONENTS Test)
  endif()
endif()

if(KVSCOPE_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
  include(Catch)
endif()

# CUDA is optional: kernels/ compiles its .cu twins when nvcc is found.
include(CheckLanguage)
if(KVSCOPE_WITH_CUDA)
  check_language(CUDA)
endif()
if(KVSCOPE_WITH_CUDA AND CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # No GPU to ask; sm_80 SASS plus compute_80 PTX runs on Ampere and newer.
    set(CMAKE_CUDA_ARCHITECTURES 80)
  endif()
  enable_language(CUDA)
  set(KVSCOPE_HAVE_CUDA ON)
  message(STATUS "CUDA: ${CMAKE_CUDA_COMPILER} (${CMAKE_CUDA_COMPILER_VERSION}); kernels/cuda is built")
else()
  set(KVSCOPE_HAVE_CUDA OFF)
  message(STATUS "CUDA: nvcc not found; kernels/cuda is skipped, CPU kernels only")
endif()

# Warnings for our own code only.
add_library(kvscope_warnings INTERFACE)
target_compile_options(kvscope_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
