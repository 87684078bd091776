# accrue_import_found_library(<PKG> <target>): the common ending of
# FindCUDNN.cmake and FindNCCL.cmake, once <PKG>_INCLUDE_DIR, <PKG>_LIBRARY and
# <PKG>_VERSION are set: the standard found/not-found report, <PKG>_INCLUDE_DIRS
# and <PKG>_LIBRARIES, and the imported target. Installed beside them.
macro(accrue_import_found_library pkg target)
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(${pkg}
    REQUIRED_VARS ${pkg}_LIBRARY ${pkg}_INCLUDE_DIR
    VERSION_VAR ${pkg}_VERSION)
  if(${pkg}_FOUND)
    set(${pkg}_INCLUDE_DIRS "${${pkg}_INCLUDE_DIR}")
    set(${pkg}_LIBRARIES "${${pkg}_LIBRARY}")
    if(NOT TARGET ${target})
      add_library(${target} UNKNOWN IMPORTED)
      set_target_properties(${target} PROPERTIES
        IMPORTED_LOCATION "${${pkg}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${${pkg}_INCLUDE_DIR}")
    endif()
  endif()
  mark_as_advanced(${pkg}_INCLUDE_DIR ${pkg}_LIBRARY)
endmacro()
