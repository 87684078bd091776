// The backend side of kernels/batch_norm.h: the functions kernels/cpu/batch_norm.cpp
// and kernels/cuda/batch_norm.cu implement, listed in
// kernels/batch_norm_functions.inc. Private to kernels/.
//
// Dispatch has checked every argument and allocated every output. x, out,
// grad and dx are one dense buffer each, all in the same layout: element
// (o, c, i) of [outer, C, inner] at offset (o C + c) inner + i (Note [Fused
// batch norm kernels]). [C] vectors are contiguous; mean, var, invstd, dweight
// and dbias have the accumulation dtype (f32, f64 for f64).
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

struct BatchNormLayout {
  int64_t outer = 0, channels = 0, inner = 0;
};

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/batch_norm_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/batch_norm_functions.inc"
}  // namespace accrue::kernels::cuda
