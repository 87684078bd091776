# FindCUDNNFrontend: the header-only cuDNN frontend (cudnn_frontend.h), as
# shipped in the include/ folder of the nvidia-cudnn-frontend wheel on PyPI.
#
# Looks, in this order, under:
#   CUDNN_FRONTEND_ROOT (CMake or environment variable): a folder holding
#     include/cudnn_frontend.h, or the include folder itself
#   third_party/cudnn_frontend of this source tree, where
#     tools/fetch_cudnn_frontend.sh unpacks the wheel (and where the GPU
#     machine, which has no network, gets it through `carry`)
#   the include/ folder of an installed wheel (python3's purelib and platlib)
#
# Provides CUDNNFrontend_FOUND, CUDNN_FRONTEND_INCLUDE_DIR,
# CUDNN_FRONTEND_VERSION and the imported target CUDNN::frontend.

set(_cfe_hints)
foreach(_root IN ITEMS "${CUDNN_FRONTEND_ROOT}" "$ENV{CUDNN_FRONTEND_ROOT}"
                       "${PROJECT_SOURCE_DIR}/third_party/cudnn_frontend")
  if(_root)
    list(APPEND _cfe_hints "${_root}")
  endif()
endforeach()
find_program(_cfe_python NAMES python3 python)
if(_cfe_python)
  execute_process(
    COMMAND "${_cfe_python}" -c
            "import sysconfig; print(sysconfig.get_paths()['purelib']); print(sysconfig.get_paths()['platlib'])"
    OUTPUT_VARIABLE _cfe_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REPLACE "\n" ";" _cfe_site "${_cfe_site}")
  list(APPEND _cfe_hints ${_cfe_site})
endif()

find_path(CUDNN_FRONTEND_INCLUDE_DIR NAMES cudnn_frontend.h
  HINTS ${_cfe_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)

if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _cfe_lines
    REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUDNN_FRONTEND_${_part}_VERSION[ \t]+([0-9]+)" _m "${_cfe_lines}")
    set(_cfe_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(CUDNN_FRONTEND_VERSION "${_cfe_MAJOR}.${_cfe_MINOR}.${_cfe_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNNFrontend
  REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR
  VERSION_VAR CUDNN_FRONTEND_VERSION)

if(CUDNNFrontend_FOUND AND NOT TARGET CUDNN::frontend)
  add_library(CUDNN::frontend INTERFACE IMPORTED)
  set_target_properties(CUDNN::frontend PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}")
endif()

mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR)
unset(_cfe_hints)
unset(_cfe_python)
unset(_cfe_site)
unset(_cfe_lines)
