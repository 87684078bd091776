# cmake -P script behind the test consumer_builds_against_installed_package
# (see CMakeLists.txt beside it for the -D variables it takes).
#
# Steps, each fatal on failure with its output shown:
#   1. cmake --install <build> --prefix <work>/prefix
#   2. configure examples/consumer with CMAKE_PREFIX_PATH=<work>/prefix
#   3. build it
#   4. run it (it checks its own result and exits nonzero when wrong)
cmake_minimum_required(VERSION 3.25)

foreach(var ACCRUE_BUILD_DIR ACCRUE_CONSUMER_SOURCE_DIR ACCRUE_CONSUMER_WORK_DIR ACCRUE_GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "build_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${ACCRUE_CONSUMER_WORK_DIR}/prefix")
set(build "${ACCRUE_CONSUMER_WORK_DIR}/build")
# A fresh prefix and build each time: stale files from an earlier install
# could hide a header or target that the install no longer provides.
file(REMOVE_RECURSE "${ACCRUE_CONSUMER_WORK_DIR}")
file(MAKE_DIRECTORY "${ACCRUE_CONSUMER_WORK_DIR}")

function(run_step name)
  list(JOIN ARGN " " command_line)
  message(STATUS "consumer: ${name}: ${command_line}")
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer: step '${name}' failed (exit ${rc}):\n${out}")
  endif()
  message(STATUS "consumer: ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step(install "${CMAKE_COMMAND}" --install "${ACCRUE_BUILD_DIR}" --prefix "${prefix}")

set(configure_args
  -S "${ACCRUE_CONSUMER_SOURCE_DIR}" -B "${build}" -G "${ACCRUE_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}")
if(ACCRUE_MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${ACCRUE_MAKE_PROGRAM}")
endif()
if(ACCRUE_CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${ACCRUE_CXX_COMPILER}")
endif()
if(ACCRUE_BUILD_TYPE)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${ACCRUE_BUILD_TYPE}")
endif()
# The consumer compiles no CUDA itself; the toolkit root is only for
# find_dependency(CUDAToolkit) in accrueConfig.cmake.
if(ACCRUE_CUDA_TOOLKIT_ROOT)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${ACCRUE_CUDA_TOOLKIT_ROOT}")
endif()
run_step(configure "${CMAKE_COMMAND}" ${configure_args})
run_step(build "${CMAKE_COMMAND}" --build "${build}")

# Ninja and Makefiles put the executable at the top of the build tree.
set(exe "${build}/accrue_consumer")
if(NOT EXISTS "${exe}")
  message(FATAL_ERROR "consumer: built, but ${exe} does not exist")
endif()
run_step(run "${exe}")
message(STATUS "consumer output:\n${step_output}")
