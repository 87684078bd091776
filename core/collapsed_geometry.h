// CollapsedGeometry: the shared shape of N strided operands (operand 0 the
// output) with size-1 dims dropped and mergeable dims merged, and the offsets
// of one linear index in every operand. Built on the host, passed by value to
// the CUDA kernels of core/copy.cu and kernels/cuda/elementwise.cu.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/strided_index.h"

namespace accrue {

// Note [Fast division]
// ~~~~~~~~~~~~~~~~~~~~
// Decomposing an index divides by each dim's size, and a 32-bit division by
// a runtime value costs a few dozen instructions, per element or pack: enough
// to keep a strided kernel below the memory bandwidth. For a divisor d in
// [1, 2^31) and n < 2^31, n / d = (umulhi(n, m) + n) >> s with s the smallest
// shift such that 2^s >= d and m = floor(2^32 (2^s - d) / d) + 1 (Granlund
// and Montgomery's round-up method), two instructions and an add. Indices of
// 2^31 and more take the plain 64-bit division.
struct FastDivider {
  uint32_t divisor = 1, magic = 1, shift = 0;

  FastDivider() = default;
  explicit FastDivider(int64_t d) : divisor(static_cast<uint32_t>(d)) {
    ACCRUE_CHECK(d >= 1 && d < (int64_t{1} << 31), "FastDivider: divisor ", d,
                 " is outside [1, 2^31)");
    while ((uint64_t{1} << shift) < divisor)
      ++shift;
    const uint64_t one = 1;
    magic = static_cast<uint32_t>(((one << 32) * ((one << shift) - divisor)) / divisor + 1);
  }
  // n / divisor for n < 2^31; the same arithmetic on the host (for tests).
  ACCRUE_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

// Note [Collapsed geometry]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// All operands of an elementwise op or a copy share the output's shape and
// differ only in strides (a broadcast operand has stride 0). The dims are
// first put in the output's memory order (largest output stride outermost,
// as PyTorch's TensorIterator does): every consumer is a pure map, which may
// visit the elements in any order, and this one writes the output in order.
// For a row-major output that is the logical order; for channels-last
// operands it is N, H, W, C, so their elementwise ops collapse to one
// contiguous dim instead of three strided ones. Then size-1 dims are dropped
// and adjacent dims merged wherever every operand is contiguous across them,
// so a bias add [N, D] + [D] becomes rank 2 and a transposed view stays
// rank 2. A kernel then divides each linear index once per (collapsed) dim and
// reuses the quotient for every operand, instead of every operand doing its
// own StridedGeometry::offset_of. Dims are stored innermost first: dim 0 is
// the one whose index moves fastest (the output's smallest stride).
template <int N>
struct CollapsedGeometry {
  int32_t rank = 0;
  bool narrow = false;  // every linear index is below 2^31: Note [Fast division]
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
  FastDivider dividers[kMaxDims];  // of sizes[d] when narrow

  // Sets `narrow` and the dividers once the sizes are final.
  void finish() {
    narrow = numel() < (int64_t{1} << 31);
    for (int d = 0; d < rank; ++d)
      dividers[d] = narrow ? FastDivider(sizes[d]) : FastDivider();
  }

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
        const uint32_t q32 = dividers[d].div(l32);
        q = q32;
        i = l32 - q32 * dividers[d].divisor;
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
    for (int d = 0; d < rank; ++d) {
      if (d == a || d == b) continue;
      g.sizes[g.rank] = sizes[d];
      for (int k = 0; k < N; ++k)
        g.strides[k][g.rank] = strides[k][d];
      ++g.rank;
    }
    g.finish();
    return g;
  }
};

// A row-major [rows, per_row] walk over `count` items: splits an item's
// index into (row, col), with Note [Fast division] when count < 2^31.
struct RowSplitter {
  int64_t per_row = 1;
  bool narrow = false;
  FastDivider fast;

  RowSplitter(int64_t count, int64_t per_row_)
      : per_row(per_row_), narrow(count < (int64_t{1} << 31)) {
    if (narrow) fast = FastDivider(per_row);
  }
#if defined(__CUDACC__)
  __device__ __forceinline__ void split(int64_t p, int64_t& row, int64_t& col) const {
    if (narrow) {
      const uint32_t q = fast.div(static_cast<uint32_t>(p));
      row = q;
      col = static_cast<uint32_t>(p) - q * fast.divisor;
    } else {
      row = p / per_row;
      col = p - row * per_row;
    }
  }
#endif
};

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
// With `splats`, an input operand (k >= 1) whose dim 0 has stride 0 is also
// taken: one value per row, read once and repeated across the pack (a scalar
// operand, the `value` of masked_fill, a per-row scale). Its bit k - 1 is set
// in *splats; its other strides and its pointer need no alignment (one
// element is read).
template <int N>
bool rows_of_packs(const CollapsedGeometry<N>& g, int64_t V, uint32_t* splats = nullptr) {
  static_assert(N <= 33, "rows_of_packs: a splat mask holds 32 inputs");
  if (splats != nullptr) *splats = 0;
  if (g.rank == 0 || g.sizes[0] % V != 0) return false;
  for (int k = 0; k < N; ++k) {
    if (k > 0 && splats != nullptr && g.strides[k][0] == 0) {
      *splats |= uint32_t{1} << (k - 1);
      continue;
    }
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
  // Note [Collapsed geometry]: the output's memory order, outermost first
  // (stable: a row-major output keeps the logical order).
  std::vector<int64_t> order(shape.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return (*strides[0])[a] > (*strides[0])[b]; });
  // Walk from the innermost dim outwards, merging into the current collapsed dim.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int64_t d = *it;
    const int64_t size = shape[d];
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
  g.finish();
  return g;
}

}  // namespace accrue
