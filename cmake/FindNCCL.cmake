# FindNCCL: the NVIDIA Collective Communications Library.
#
# Looks, in this order, under:
#   NCCL_ROOT (CMake or environment variable), NCCL_HOME (environment)
#   the CUDA toolkit (CUDAToolkit_LIBRARY_ROOT, CUDAToolkit_TARGET_DIR, the
#     directories of CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR),
#     /usr/local/cuda: where the developer machines have it
#   the system paths (/usr/include, /usr/lib/x86_64-linux-gnu): where the
#     Debian/Ubuntu packages libnccl-dev put it (the H100 machines)
#
# Provides:
#   NCCL_FOUND, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES
#   NCCL_VERSION (MAJOR.MINOR.PATCH read from nccl.h), NCCL_VERSION_MAJOR/MINOR/PATCH
#   the imported target NCCL::nccl

set(_nccl_hints)
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()

# The CUDA toolkit's own directories come next, as HINTS so that they are
# searched before the system paths: a toolkit that ships NCCL (as
# /usr/local/cuda does on the developer machines) should win over an
# unrelated system copy.
set(_nccl_cuda_paths)
foreach(_root IN ITEMS "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}"
                       "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}"
                       "/usr/local/cuda")
  if(_root)
    list(APPEND _nccl_cuda_paths "${_root}")
  endif()
endforeach()
set(_nccl_cuda_include_dirs ${CUDAToolkit_INCLUDE_DIRS})
set(_nccl_cuda_lib_dirs ${CUDAToolkit_LIBRARY_DIR})

find_path(NCCL_INCLUDE_DIR
  NAMES nccl.h
  HINTS ${_nccl_hints} ${_nccl_cuda_include_dirs} ${_nccl_cuda_paths}
  PATH_SUFFIXES include)

# libnccl.so.2 is the only name in the pip wheel nvidia-nccl-cu13
# (site-packages/nvidia/nccl/lib), which NCCL_ROOT may point at.
find_library(NCCL_LIBRARY
  NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${_nccl_hints} ${_nccl_cuda_lib_dirs} ${_nccl_cuda_paths}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

# Note [Version from the header]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The version is read from the header that will be compiled against, not from
# the library's file name: a mismatched pair shows up as a wrong version here
# rather than as a link error later.
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
    REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part}[ \t]+([0-9]+)" _match "${_nccl_version_lines}")
    set(NCCL_VERSION_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT NCCL_VERSION_MAJOR STREQUAL "")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  endif()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/AccrueImportFoundLibrary.cmake)
accrue_import_found_library(NCCL NCCL::nccl)
unset(_nccl_hints)
unset(_nccl_cuda_paths)
unset(_nccl_cuda_include_dirs)
unset(_nccl_cuda_lib_dirs)
unset(_nccl_version_lines)
