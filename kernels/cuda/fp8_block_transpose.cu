// Note [FP8 block cast of a transpose]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The block recipe's weight gradients take x^T and dy^T in 1 x 128 tiles
// along the tokens (Note [FP8 block recipe] in autograd/ops_fp8.cpp). Cast as
// a transposed view, each went through a bf16 transpose copy first: 10 bytes
// moved an element (the copy's 4 between two casts) where the tensor recipe's
// fused cast-transpose moves 4. This kernel reads the base x [M, K] once and
// writes q_t [K, M] with a scale per 128 consecutive rows of each column:
// a block takes a 128 x 64 patch of x in 16-byte packs into shared memory as
// f32, four threads a column take its max over 32 rows each, the column's
// scale follows the rule of cast_to_fp8_blockwise (the same f32 operations,
// so the same bits as casting the contiguous transpose), and each thread
// writes 8 codes of a q_t row as one 8-byte word. It needs K a multiple of
// the pack (8 for bf16/f16, 4 for f32), M a multiple of 8 and aligned
// buffers, as every FP8 GEMM operand is (Note [FP8 GEMM]); other shapes take
// the transpose copy and the blockwise cast.
#include <cstdint>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/fp8_device.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace {

using namespace fp8_device;  // NOLINT: the family's shared helpers

constexpr int kRows = 128;  // the tile along M: one scale per column's 128 rows
constexpr int kCols = 64;   // columns a block takes
constexpr int kParts = kThreads / kCols;
constexpr int kChunk = 8;  // codes per q_t store

template <class T, class Q>
__global__ void __launch_bounds__(kThreads)
    cast_blockwise_transposed_kernel(const T* __restrict__ x, int64_t m, int64_t k, float fp8_max,
                                     bool power_of_two, uint8_t* __restrict__ q_t,
                                     float* __restrict__ scale_inv,
                                     uint32_t* __restrict__ amax_bits) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kPacksPerRow = kCols / V;
  __shared__ float tile[kRows][kCols + 1];
  __shared__ uint32_t part_max[kParts][kCols];
  __shared__ float col_scale[kCols];
  const int64_t tiles_m = (m + kRows - 1) / kRows, tiles_k = (k + kCols - 1) / kCols;
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < tiles_m * tiles_k; t += gridDim.x) {
    const int64_t tm = t / tiles_k, r0 = tm * kRows, c0 = (t % tiles_k) * kCols;
    // x's patch, 0 outside x (a 0 changes no max and is never written).
    for (int i = threadIdx.x; i < kRows * kPacksPerRow; i += kThreads) {
      const int row = i / kPacksPerRow, col = (i % kPacksPerRow) * V;
      const int64_t r = r0 + row, c = c0 + col;
      if (r < m && c < k) {  // K % V == 0: a pack is all in or all out
        const cu::Pack<T, V> in = cu::load_pack<V>(x + r * k + c, 0);
#pragma unroll
        for (int e = 0; e < V; ++e)
          tile[row][col + e] = cu::convert<float>(in.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          tile[row][col + e] = 0.0f;
      }
    }
    __syncthreads();
    {
      const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;
      uint32_t mx = 0;
      for (int row = part * (kRows / kParts); row < (part + 1) * (kRows / kParts); ++row)
        mx = max(mx, abs_bits(tile[row][col]));
      part_max[part][col] = mx;
    }
    __syncthreads();
    if (threadIdx.x < kCols) {
      const int col = threadIdx.x;
      uint32_t bits = 0;
#pragma unroll
      for (int p = 0; p < kParts; ++p)
        bits = max(bits, part_max[p][col]);
      const float s = fp8_scale_rule(__uint_as_float(bits), fp8_max, 0, power_of_two);
      col_scale[col] = s;
      if (c0 + col < k) {
        scale_inv[(c0 + col) * tiles_m + tm] = 1.0f / s;
        local = max(local, bits);
      }
    }
    __syncthreads();
    // q_t's rows c0 .. c0 + 63, columns r0 .. r0 + 127, 8 codes a store.
    constexpr int kChunksPerCol = kRows / kChunk;
    for (int i = threadIdx.x; i < kCols * kChunksPerCol; i += kThreads) {
      const int col = i / kChunksPerCol, chunk = i % kChunksPerCol;
      const int64_t c = c0 + col, r = r0 + chunk * kChunk;
      if (c >= k || r >= m) continue;  // M % 8 == 0: a chunk is all in or all out
      const float s = col_scale[col];
      cu::Pack<uint8_t, kChunk> out;
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        out.v[e] = Q(tile[chunk * kChunk + e][col] * s).__x;  // as cast_blockwise_kernel
      cu::store_pack<kChunk>(q_t + c * m + r, 0, out);
    }
    __syncthreads();
  }
  merge_amax(local, amax_bits);
}

}  // namespace

void cast_to_fp8_blockwise_of_transpose(const Tensor& base, float fp8_max, bool power_of_two,
                                        const Tensor& q_t, const Tensor& scale_inv,
                                        const Tensor& amax) {
  const int dev = base.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t m = base.size(0), k = base.size(1);
  bool fused = false;
  cu::visit_float_dtype(base.dtype(), "cast_to_fp8_blockwise", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const auto* px = static_cast<const T*>(base.data_ptr());
    auto* pq = static_cast<uint8_t*>(q_t.data_ptr());
    static_assert(kCols % kV == 0, "a block's columns are whole packs");
    if (k % kV != 0 || m % kChunk != 0 || !cu::pack_aligned<kV>(px) ||
        !cu::pack_aligned<kChunk>(pq))
      return;
    ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
    visit_fp8(q_t.dtype(), [&](auto qtag) {
      using Q = decltype(qtag);
      const int64_t tiles = (m + kRows - 1) / kRows * ((k + kCols - 1) / kCols);
      cast_blockwise_transposed_kernel<T, Q>
          <<<cu::grid_for(tiles, 1, int64_t{kBlocksPerSm} * cu::sm_count(dev)), kThreads, 0,
             stream>>>(px, m, k, fp8_max, power_of_two, pq,
                       static_cast<float*>(scale_inv.data_ptr()),
                       static_cast<uint32_t*>(amax.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
    fused = true;
  });
  if (!fused)
    cast_to_fp8_blockwise(base.transpose(0, 1).contiguous(), 1, kRows, fp8_max, power_of_two, q_t,
                          scale_inv, amax);
}

}  // namespace accrue::kernels::cuda
