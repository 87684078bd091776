// The backend side of the FP8 family (kernels/fp8.h): the scale rule, written
// once for host and device, and the functions kernels/cpu/fp8.cpp and
// kernels/cuda/fp8.cu implement (kernels/fp8_functions.inc). Private to
// kernels/.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "accrue/core/host_device.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// Note [FP8 scaling]'s current-scaling rule, in f32 on both backends (one
// IEEE division, then exact power-of-two operations), so the CPU and CUDA
// scales are the same bits. margin is in [0, kFp8MaxMargin], which keeps s
// normal: s >= 448 / FLT_MAX * 2^-6 > FLT_MIN, so every halving is exact and
// the power-of-two rounding is well defined.
inline constexpr int kFp8MaxMargin = 6;
// The widest tile of Note [FP8 block scaling]: one CUDA block's threads span
// a tile row.
inline constexpr int64_t kFp8MaxTileCols = 1024;

ACCRUE_HD float fp8_scale_rule(float amax, float fp8_max, int margin, bool power_of_two) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return 1.0f;  // zero, NaN or infinity
  float s = fp8_max / amax;
  if (!(s <= FLT_MAX)) s = FLT_MAX;
  for (int i = 0; i < margin; ++i)
    s *= 0.5f;
  if (power_of_two) {
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    u &= 0xff800000u;  // sign and exponent: 2^floor(log2 s) for a normal s
    memcpy(&s, &u, sizeof u);
  }
  return s;
}

// scale_inv = 1 / s, or NaN when amax is not finite with guard on: 1 / s +
// amax * 0, the same f32 operations as autograd's fp8_guarded_scale_inv
// (Note [FP8 overflow] in autograd/ops_fp8.cpp), so folding the guard into
// the scale rule changes no bit.
ACCRUE_HD float fp8_inverse_scale(float amax, float s, bool guard) {
  const float inv = 1.0f / s;
  return guard ? inv + amax * 0.0f : inv;
}

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/fp8_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/fp8_functions.inc"
}  // namespace accrue::kernels::cuda
