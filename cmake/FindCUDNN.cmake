# FindCUDNN: NVIDIA cuDNN (version 8 or 9).
#
# Looks, in this order, under:
#   CUDNN_ROOT (CMake or environment variable), CUDNN_HOME (environment)
#   the CUDA toolkit (CUDAToolkit_LIBRARY_ROOT, CUDAToolkit_TARGET_DIR, the
#     directories of CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR),
#     /usr/local/cuda: where the developer machines have it
#   the system paths (/usr/include, /usr/include/x86_64-linux-gnu,
#     /usr/lib/x86_64-linux-gnu): where NVIDIA's Debian/Ubuntu packages put it
#     (the H100 machines)
#
# Provides:
#   CUDNN_FOUND, CUDNN_INCLUDE_DIRS, CUDNN_LIBRARIES
#   CUDNN_VERSION (MAJOR.MINOR.PATCH read from cudnn_version.h),
#   CUDNN_VERSION_MAJOR/MINOR/PATCH
#   the imported target CUDNN::cudnn

set(_cudnn_hints)
foreach(_root IN ITEMS "${CUDNN_ROOT}" "$ENV{CUDNN_ROOT}" "$ENV{CUDNN_HOME}")
  if(_root)
    list(APPEND _cudnn_hints "${_root}")
  endif()
endforeach()

# The CUDA toolkit's own directories are HINTS too, so that they are searched
# before the system paths (see FindNCCL.cmake).
set(_cudnn_cuda_paths)
foreach(_root IN ITEMS "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}"
                       "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}"
                       "/usr/local/cuda")
  if(_root)
    list(APPEND _cudnn_cuda_paths "${_root}")
  endif()
endforeach()

# cudnn_version.h exists since cuDNN 8; cudnn.h alone would not give the version.
find_path(CUDNN_INCLUDE_DIR
  NAMES cudnn_version.h
  HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS} ${_cudnn_cuda_paths}
  PATH_SUFFIXES include include/x86_64-linux-gnu)

# libcudnn.so.9 / .8 are the only names in the pip wheels (nvidia-cudnn-cu13).
find_library(CUDNN_LIBRARY
  NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
  HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR} ${_cudnn_cuda_paths}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

# See Note [Version from the header] in FindNCCL.cmake.
if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_version_lines
    REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part}[ \t]+([0-9]+)" _match "${_cudnn_version_lines}")
    set(_cudnn_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _cudnn_MAJOR STREQUAL "")
    set(CUDNN_VERSION_MAJOR "${_cudnn_MAJOR}")
    set(CUDNN_VERSION_MINOR "${_cudnn_MINOR}")
    set(CUDNN_VERSION_PATCH "${_cudnn_PATCHLEVEL}")
    set(CUDNN_VERSION "${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCH}")
  endif()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/AccrueImportFoundLibrary.cmake)
accrue_import_found_library(CUDNN CUDNN::cudnn)
unset(_cudnn_hints)
unset(_cudnn_cuda_paths)
unset(_cudnn_version_lines)
unset(_cudnn_MAJOR)
unset(_cudnn_MINOR)
unset(_cudnn_PATCHLEVEL)
