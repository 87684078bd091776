// CollapsedGeometry: the shared shape of N strided operands (operand 0 the
// output) with size-1 dims dropped and mergeable dims merged, and the offsets
// of one linear index in every operand. Built on the host, passed by value to
// the CUDA kernels of core/copy.cu and kernels/cuda/elementwise.cu.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/strided_index.h"

namespace accrue {

// Note [Collapsed geometry]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// All operands of an elementwise op or a copy share the output's shape and
// differ only in strides (a broadcast operand has stride 0). Size-1 dims are
// dropped and adjacent dims merged wherever every operand is contiguous across
// them, so a bias add [N, D] + [D] becomes rank 2 and a transposed view stays
// rank 2. A kernel then divides each linear index once per (collapsed) dim and
// reuses the quotient for every operand, instead of every operand doing its
// own StridedGeometry::offset_of. Dims are stored innermost first: dim 0 is
// the one whose index moves fastest.
template <int N>
struct CollapsedGeometry {
  int32_t rank = 0;
  bool narrow = false;  // every linear index fits in 32 bits: cheaper division
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d)
      n *= sizes[d];
    return n;
  }

#if defined(__CUDACC__)
  // The offsets of row-major index `linear` in every operand.
  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k)
      off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == rank) break;
      int64_t q, i;
      if (narrow) {
        const uint32_t l32 = static_cast<uint32_t>(linear);
        const uint32_t s32 = static_cast<uint32_t>(sizes[d]);
        const uint32_t q32 = l32 / s32;
        q = q32;
        i = l32 - q32 * s32;
      } else {
        q = linear / sizes[d];
        i = linear - q * sizes[d];
      }
      linear = q;
#pragma unroll
      for (int k = 0; k < N; ++k)
        off[k] += i * strides[k][d];
    }
  }
#endif

  // The same geometry without dims `a` and `b` (b may equal a, or be -1 for
  // none): what is left once a kernel walks those dims itself.
  CollapsedGeometry without(int a, int b = -1) const {
    CollapsedGeometry g;
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
      if (d == a || d == b) continue;
      g.sizes[g.rank] = sizes[d];
      for (int k = 0; k < N; ++k)
        g.strides[k][g.rank] = strides[k][d];
      n *= sizes[d];
      ++g.rank;
    }
    g.narrow = n <= static_cast<int64_t>(UINT32_MAX);
    return g;
  }
};

// Splits index p of a row-major [rows, per_row] walk into (row, col); 32-bit
// division when `narrow` (p < 2^32).
#if defined(__CUDACC__)
__device__ __forceinline__ void split_row(int64_t p, int64_t per_row, bool narrow, int64_t& row,
                                          int64_t& col) {
  if (narrow) {
    const uint32_t q = static_cast<uint32_t>(p) / static_cast<uint32_t>(per_row);
    row = q;
    col = static_cast<uint32_t>(p) - q * static_cast<uint32_t>(per_row);
  } else {
    row = p / per_row;
    col = p - row * per_row;
  }
}
#endif

// Note [Rows of packs]
// ~~~~~~~~~~~~~~~~~~~~
// A strided or broadcast view whose innermost collapsed dim is contiguous in
// every operand (the [B, H, T, T] + [T, T] mask add, a narrowed column block,
// a permute that keeps the last dim) moves that dim in 16-byte packs: the
// index arithmetic runs once per pack instead of once per element, and the
// loads and stores are vectors. It needs every operand's dim 0 contiguous
// (stride 1) and a whole number of packs of V elements, every other stride a
// multiple of V, and every pointer aligned to a pack (the caller checks the
// pointers). Anything else decomposes each element's own index.
template <int N>
bool rows_of_packs(const CollapsedGeometry<N>& g, int64_t V) {
  if (g.rank == 0 || g.sizes[0] % V != 0) return false;
  for (int k = 0; k < N; ++k) {
    if (g.strides[k][0] != 1) return false;
    for (int d = 1; d < g.rank; ++d)
      if (g.strides[k][d] % V != 0) return false;
  }
  return true;
}

// Builds the collapsed geometry of `shape` under each operand's strides
// (operand 0 is the output). `op` names the caller in the error for a shape
// of more than kMaxDims dims that do not merge.
template <int N>
CollapsedGeometry<N> collapse_geometry(const std::vector<int64_t>& shape,
                                       const std::array<const std::vector<int64_t>*, N>& strides,
                                       const char* op) {
  CollapsedGeometry<N> g;
  int64_t numel = 1;
  // Walk from the innermost dim outwards, merging into the current collapsed dim.
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    const int64_t size = shape[d];
    numel *= size;
    if (size == 1) continue;
    const int r = g.rank;
    bool merge = r > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = (*strides[k])[d] == g.strides[k][r - 1] * g.sizes[r - 1];
    if (merge) {
      g.sizes[r - 1] *= size;
    } else {
      ACCRUE_CHECK(r < kMaxDims, op, ": tensors of more than ", kMaxDims,
                   " non-mergeable dims are not supported (shape ", shape_str(shape), ")");
      g.sizes[r] = size;
      for (int k = 0; k < N; ++k)
        g.strides[k][r] = (*strides[k])[d];
      g.rank = r + 1;
    }
  }
  g.narrow = numel <= static_cast<int64_t>(UINT32_MAX);
  return g;
}

}  // namespace accrue
