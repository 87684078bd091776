// Maps a linear row-major index over a shape to an element offset under
// strides. Shared by the CPU loops and, through ACCRUE_HD, the CUDA kernels.
#pragma once

#include <cstdint>

#include "accrue/core/host_device.h"

namespace accrue {

inline constexpr int kMaxDims = 8;

// Fixed-size geometry passed by value to kernels.
struct StridedGeometry {
  int32_t rank = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  ACCRUE_HD int64_t offset_of(int64_t linear) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

}  // namespace accrue
