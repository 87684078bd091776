// One generator for every library status check: CUDA, cuBLAS, cuDNN, NCCL.
//
// Each macro evaluates the call once, compares it with the library's success
// value and throws accrue::Error naming the library, the message, the code,
// the expression and file:line. The library headers are not included here: a
// macro only needs its library where it is expanded.
#pragma once

#include "accrue/core/error.h"

#define ACCRUE_STATUS_CHECK_GEN(expr, success, to_string, library)            \
  do {                                                                        \
    auto accrue_status_ = (expr);                                             \
    if (accrue_status_ != (success))                                          \
      ACCRUE_FAIL(library, " error ", static_cast<int>(accrue_status_), " (", \
                  to_string(accrue_status_), ") in ", #expr);                 \
  } while (0)

#define ACCRUE_CUDA_CHECK(expr) \
  ACCRUE_STATUS_CHECK_GEN(expr, cudaSuccess, cudaGetErrorString, "CUDA")
// cuBLAS and cuBLASLt share one status type; cuBLASLt names it.
#define ACCRUE_CUBLAS_CHECK(expr) \
  ACCRUE_STATUS_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, "cuBLAS")
#define ACCRUE_CUDNN_CHECK(expr) \
  ACCRUE_STATUS_CHECK_GEN(expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, "cuDNN")
#define ACCRUE_NCCL_CHECK(expr) \
  ACCRUE_STATUS_CHECK_GEN(expr, ncclSuccess, ncclGetErrorString, "NCCL")

// After every kernel launch: a bad configuration is reported where it happened.
#define ACCRUE_LAUNCH_CHECK() ACCRUE_CUDA_CHECK(cudaGetLastError())
