// The StridedGeometry of a tensor: its rank, sizes and strides in the
// fixed-size form that the CPU copy loops (core/copy.cpp) and the CUDA copy
// kernels (core/copy.cu) both index with. Host code only.
#pragma once

#include <cstdint>

#include "accrue/core/strided_index.h"
#include "accrue/core/tensor.h"

namespace accrue::detail {

inline StridedGeometry geometry_of(const Tensor& t) {
  StridedGeometry g;
  g.rank = static_cast<int32_t>(t.dim());
  for (int d = 0; d < g.rank; ++d) {
    g.sizes[d] = t.shape()[d];
    g.strides[d] = t.strides()[d];
  }
  return g;
}

}  // namespace accrue::detail
