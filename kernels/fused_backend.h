// The backend side of the transformer fusions (kernels/fused.h): the functions
// kernels/cpu/fused.cpp, kernels/cuda/fused.cu and kernels/cuda/gemm_epilogue.cu
// implement, listed in kernels/fused_functions.inc. kernels/fused.cpp has
// validated everything and allocated every output; all tensors are contiguous
// and on one device. Private to kernels/.
#pragma once

#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels::cpu {
#include "accrue/kernels/fused_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/fused_functions.inc"
}  // namespace accrue::kernels::cuda
