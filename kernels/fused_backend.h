// The backend side of the transformer fusions (kernels/fused.h): the functions
// kernels/cpu/fused.cpp, kernels/cuda/fused.cu and kernels/cuda/gemm_epilogue.cu
// implement, listed in kernels/fused_functions.inc. kernels/fused.cpp has
// validated everything and allocated every output; all tensors are contiguous
// and on one device. Private to kernels/.
#pragma once

#include <cmath>

#include "accrue/core/host_device.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"
#include "accrue/kernels/fused.h"

namespace accrue::kernels {

// Note [Rotary embedding]: inv_freq of pair i of a head dim d, in F (float
// as transformers computes it, double for f64 inputs), written once for the
// CPU reference and the CUDA kernel. The power is taken in double and
// rounded, which is transformers' f32 power wherever that one is correctly
// rounded; every later step rounds in F in transformers' order (a scalar
// divided by a tensor is its reciprocal times the scalar there).
template <class F>
ACCRUE_HD F rope_inv_freq(int64_t i, int64_t d, double theta, const RopeScaling& s) {
  const F exponent = static_cast<F>(2 * i) / static_cast<F>(d);
  const F inv = F(1) / static_cast<F>(::pow(theta, static_cast<double>(exponent)));
  if (s.type != RopeScaling::Type::llama3) return inv;
  const double old = static_cast<double>(s.original_max_position);
  const F factor = static_cast<F>(s.factor);
  const F low_wavelen = static_cast<F>(old / s.low_freq_factor);
  const F high_wavelen = static_cast<F>(old / s.high_freq_factor);
  const F wavelen = (F(1) / inv) * static_cast<F>(2.0 * 3.14159265358979323846);
  F scaled = wavelen > low_wavelen ? inv / factor : inv;
  if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
    const F smooth = ((F(1) / wavelen) * static_cast<F>(old) - static_cast<F>(s.low_freq_factor)) /
                     static_cast<F>(s.high_freq_factor - s.low_freq_factor);
    scaled = (F(1) - smooth) * scaled / factor + smooth * scaled;
  }
  return scaled;
}

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/fused_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/fused_functions.inc"
}  // namespace accrue::kernels::cuda
