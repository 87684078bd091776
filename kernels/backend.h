// The interface that both backends implement: kernels/cpu/ (namespace
// accrue::kernels::cpu, the reference) and kernels/cuda/ (accrue::kernels::cuda).
//
// Dispatch (kernels/dispatch.cpp) has already validated everything and
// allocated every output, so a backend function only computes. Conventions:
//  - "any strides": the tensor may be a strided view, including 0 strides from
//    broadcasting (expand); its shape equals the output's shape.
//  - "contiguous": row-major with no gaps, offset applied by data_ptr().
//  - floating tensors are f32, f64, bf16 or f16; 16-bit ones compute in fp32;
//    sums accumulate in fp32 (f64 for f64), in a fixed order (deterministic).
//  - index tensors are i32 or i64.
#pragma once

#include "kernels/ops.h"

namespace accrue::kernels::cpu {
#include "kernels/backend_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "kernels/backend_functions.inc"
}  // namespace accrue::kernels::cuda
