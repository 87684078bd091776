// Dropout by counter: the mask is never stored.
//
// Note [Dropout mask from the counter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Element i (row-major over the tensor's shape) is kept when the Philox
// uniform draw at (seed, offset + i) is >= p, and kept elements are scaled by
// 1 / (1 - p). The draw is the one of core/philox.h, so the CPU and every GPU
// produce the same mask, and backward regenerates it from (seed, offset)
// instead of saving it.
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// Returns mask(seed, offset) * x / (1 - p); p in [0, 1). Any strides; the result is contiguous.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);
// The same mask applied to grad (shape of the forward input).
Tensor dropout_backward(const Tensor& grad, double p, uint64_t seed, uint64_t offset);

}  // namespace accrue::kernels
