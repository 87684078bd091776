// The backend side of dropout (kernels/dropout.h): the mask, written once for
// host and device, and the function kernels/cpu/dropout.cpp and
// kernels/cuda/dropout.cu implement (kernels/dropout_functions.inc). Private
// to kernels/.
#pragma once

#include <cmath>
#include <cstdint>

#include "accrue/core/host_device.h"
#include "accrue/core/philox.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// Note [Dropout threshold]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The uniform of element i is philox::uniform_float's k / 2^24, with k the top
// 24 bits of its first Philox lane (Note [Philox element mapping]), so it is
// the f32 value accrue::rand draws for element i at the same generator state,
// for every dtype. k / 2^24 >= p exactly when k >= ceil(p * 2^24) (the product
// is exact in double), so both backends decide with one integer comparison
// and can never disagree on a rounding.
inline uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(std::ceil(p * 16777216.0));
}

// The keep decisions of elements 2j and 2j + 1 of a mask starting at counter
// `offset`: both come from Philox block offset + j, lanes 0 and 2 (Note
// [Philox element mapping]), so one block serves the pair.
ACCRUE_HD void dropout_keep_pair(uint64_t seed, uint64_t offset, int64_t j, uint32_t threshold,
                                 bool* keep_even, bool* keep_odd) {
  const philox::Block block = philox::generate(seed, offset + static_cast<uint64_t>(j));
  *keep_even = (block.x[0] >> 8) >= threshold;
  *keep_odd = (block.x[2] >> 8) >= threshold;
}

// One mask: element i of `in` (contiguous) becomes in[i] * scale when kept and
// 0 otherwise, written to out (contiguous, same shape and dtype). scale is
// 1 / (1 - p), applied in the math type (float for 16-bit dtypes and f32,
// double for f64).
struct DropoutMask {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t threshold = 0;
  double scale = 1.0;
};

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/dropout_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/dropout_functions.inc"
}  // namespace accrue::kernels::cuda
