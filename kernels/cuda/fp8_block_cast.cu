// The block recipe's casts (Note [FP8 block scaling] in kernels/fp8.h): each
// tile of x with its own scale, for the FP8 family of kernels/cuda/fp8.cu.
#include <cstdint>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/fp8_device.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

using namespace fp8_device;  // NOLINT: the family's shared helpers

// Note [FP8 block cast kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The block recipe's tiles (Note [FP8 block scaling]) are 128 columns wide:
// a warp takes a 128-column segment of a row, lane l the 4 values at columns
// 4l..4l+3 (one 8-byte load for bf16 and f16, 16 bytes for f32), the
// segment's max a warp reduction, and each lane stores its 4 codes as one
// word. A 1 x 128 tile is one segment, the warps of a grid-stride loop
// taking kTilesPerWarp consecutive tiles at a time, all their loads issued
// before the first reduction; a 128 x 128 tile is one block's, its 8 warps
// 16 rows each, held in registers from the max to the cast. The amax is one
// atomicMax per block. Measured on an H100: the one-block-per-tile kernel
// (a 128-thread block per tile, a load per element) took 57% of a llama-125m
// block-recipe window under ncu (110 us for a 16384 x 768 bf16 cast that
// moves 37 MB); the first segment kernel, one tile a warp at a time and the
// 128 x 128 tile read twice, ran at 0.51 and 0.62 of the copy rate, with one
// load in flight a warp (40% of DRAM peak). Shapes the segment kernel does
// not take (other tile shapes, columns not a multiple of 4, unaligned
// buffers) keep the one-block-per-tile kernel, kBlockThreads threads
// spanning a tile row.
constexpr int kBlockThreads = 128;
constexpr int kSegment = 128;
constexpr int kSegmentLane = kSegment / 32;
constexpr int kTilesPerWarp = 4;  // 1 x 128 tiles a warp loads before it reduces any

template <class T, class Q>
__global__ void __launch_bounds__(kBlockThreads)
    cast_blockwise_kernel(const T* __restrict__ x, int64_t m, int64_t k, int64_t tile_rows,
                          int64_t tile_cols, int64_t tiles_c, float fp8_max, bool power_of_two,
                          Q* __restrict__ q, float* __restrict__ scale_inv,
                          uint32_t* __restrict__ amax_bits) {
  __shared__ uint32_t warp_max[kBlockThreads / 32];
  const int64_t t = blockIdx.x;
  const int64_t r0 = (t / tiles_c) * tile_rows, c0 = (t % tiles_c) * tile_cols;
  const int64_t r1 = min(m, r0 + tile_rows), c1 = min(k, c0 + tile_cols);
  uint32_t local = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
      local = max(local, abs_bits(cu::convert<float>(x[r * k + c])));
  const uint32_t tile_bits = block_max(local, warp_max);
  const float s = fp8_scale_rule(__uint_as_float(tile_bits), fp8_max, 0, power_of_two);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
      q[r * k + c] = Q(cu::convert<float>(x[r * k + c]) * s);
  if (threadIdx.x == 0) {
    scale_inv[t] = 1.0f / s;
    if (tile_bits != 0u) atomicMax(amax_bits, tile_bits);
  }
}

// The largest |value| of a lane's pack, as abs_bits orders them.
template <class T>
__device__ __forceinline__ uint32_t segment_max(const cu::Pack<T, kSegmentLane>& v) {
  uint32_t mx = 0;
#pragma unroll
  for (int j = 0; j < kSegmentLane; ++j)
    mx = max(mx, abs_bits(cu::convert<float>(v.v[j])));
  return mx;
}

template <class Q, class T>
__device__ __forceinline__ cu::Pack<uint8_t, kSegmentLane> segment_codes(
    const cu::Pack<T, kSegmentLane>& v, float s) {
  cu::Pack<uint8_t, kSegmentLane> out;
#pragma unroll
  for (int j = 0; j < kSegmentLane; ++j)
    out.v[j] = Q(cu::convert<float>(v.v[j]) * s).__x;  // as cast_blockwise_kernel
  return out;
}

// Note [FP8 block cast kernel]. kTileRows is 1 or kSegment; k % 4 == 0, and
// x and q are aligned for 4-value packs.
template <class T, class Q, int kTileRows>
__global__ void __launch_bounds__(kThreads)
    cast_blockwise_segments_kernel(const T* __restrict__ x, int64_t m, int64_t k, int64_t tiles_c,
                                   float fp8_max, bool power_of_two, uint8_t* __restrict__ q,
                                   float* __restrict__ scale_inv,
                                   uint32_t* __restrict__ amax_bits) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kPacksPerSegment = kSegment / kSegmentLane;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t packs_per_row = k / kSegmentLane;
  uint32_t local = 0;
  if constexpr (kTileRows == 1) {
    // kTilesPerWarp consecutive tiles a warp: every load issued before any reduction.
    const int64_t tiles = m * tiles_c;
    const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps * kTilesPerWarp;
    for (int64_t t0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kTilesPerWarp;
         t0 < tiles; t0 += step) {
      cu::Pack<T, kSegmentLane> v[kTilesPerWarp];
      int64_t at[kTilesPerWarp];
      bool in[kTilesPerWarp];
      int64_t r = t0 / tiles_c, c = t0 - r * tiles_c;
#pragma unroll
      for (int u = 0; u < kTilesPerWarp; ++u) {
        const int64_t pack = c * kPacksPerSegment + lane;  // in row r
        in[u] = t0 + u < tiles && pack < packs_per_row;
        at[u] = r * packs_per_row + pack;
        if (in[u]) v[u] = cu::load_pack<kSegmentLane>(x, at[u]);
        if (++c == tiles_c) {
          c = 0;
          ++r;
        }
      }
#pragma unroll
      for (int u = 0; u < kTilesPerWarp; ++u) {
        if (t0 + u >= tiles) break;  // the same for the whole warp
        const uint32_t tile_bits = __reduce_max_sync(0xffffffffu, in[u] ? segment_max(v[u]) : 0u);
        const float s = fp8_scale_rule(__uint_as_float(tile_bits), fp8_max, 0, power_of_two);
        if (in[u]) cu::store_pack<kSegmentLane>(q, at[u], segment_codes<Q>(v[u], s));
        if (lane == 0) scale_inv[t0 + u] = 1.0f / s;
        local = max(local, tile_bits);
      }
    }
  } else {
    // The block's tile: warp w the rows w, w + kWarps, ..., held in registers
    // between the max and the cast (one read of x).
    constexpr int kRowsPerWarp = kTileRows / kWarps;
    __shared__ uint32_t warp_max[kWarps];
    const int64_t t = blockIdx.x;
    const int64_t r0 = (t / tiles_c) * kTileRows, r_end = min(m, r0 + kTileRows);
    const int64_t pack = (t % tiles_c) * kPacksPerSegment + lane;
    const bool in = pack < packs_per_row;
    cu::Pack<T, kSegmentLane> v[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t r = r0 + warp + i * kWarps;
      if (in && r < r_end) v[i] = cu::load_pack<kSegmentLane>(x, r * packs_per_row + pack);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (in && r0 + warp + i * kWarps < r_end) local = max(local, segment_max(v[i]));
    const uint32_t tile_bits = block_max(local, warp_max);
    const float s = fp8_scale_rule(__uint_as_float(tile_bits), fp8_max, 0, power_of_two);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t r = r0 + warp + i * kWarps;
      if (in && r < r_end)
        cu::store_pack<kSegmentLane>(q, r * packs_per_row + pack, segment_codes<Q>(v[i], s));
    }
    if (threadIdx.x == 0) scale_inv[t] = 1.0f / s;
    local = tile_bits;
  }
  merge_amax(local, amax_bits);
}

}  // namespace

void cast_to_fp8_blockwise(const Tensor& x, int64_t tile_rows, int64_t tile_cols, float fp8_max,
                           bool power_of_two, const Tensor& q, const Tensor& scale_inv,
                           const Tensor& amax) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t tiles = scale_inv.numel();
  ACCRUE_CHECK(tiles <= 0x7fffffff, "cast_to_fp8_blockwise: ", tiles,
               " tiles exceed one launch's grid");
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  cu::visit_float_dtype(x.dtype(), "cast_to_fp8_blockwise", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), [&](auto qtag) {
      using Q = decltype(qtag);
      const auto* px = static_cast<const T*>(x.data_ptr());
      auto* pq = static_cast<uint8_t*>(q.data_ptr());
      auto* ps = static_cast<float*>(scale_inv.data_ptr());
      auto* pa = static_cast<uint32_t*>(amax.data_ptr());
      const int64_t m = x.size(0), k = x.size(1), tiles_c = scale_inv.size(1);
      // Note [FP8 block cast kernel]: the segment kernel where it applies
      // (16-bit and f32 x: f64 packs of 4 would not fit one load).
      constexpr bool kPackable = sizeof(T) * kSegmentLane <= 16;
      const bool segments = kPackable && tile_cols == kSegment &&
                            (tile_rows == 1 || tile_rows == kSegment) && k % kSegmentLane == 0 &&
                            cu::pack_aligned<kSegmentLane>(px) &&
                            cu::pack_aligned<kSegmentLane>(pq);
      if constexpr (kPackable) {
        if (segments && tile_rows == 1) {
          cast_blockwise_segments_kernel<T, Q, 1>
              <<<cu::grid_for(tiles, kThreads / 32 * kTilesPerWarp,
                              int64_t{kBlocksPerSm} * cu::sm_count(dev)),
                 kThreads, 0, stream>>>(px, m, k, tiles_c, fp8_max, power_of_two, pq, ps, pa);
        } else if (segments) {
          cast_blockwise_segments_kernel<T, Q, kSegment>
              <<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(px, m, k, tiles_c, fp8_max,
                                                                      power_of_two, pq, ps, pa);
        }
      }
      if (!segments) {
        cast_blockwise_kernel<T, Q><<<static_cast<unsigned>(tiles), kBlockThreads, 0, stream>>>(
            px, m, k, tile_rows, tile_cols, tiles_c, fp8_max, power_of_two,
            reinterpret_cast<Q*>(pq), ps, pa);
      }
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

}  // namespace accrue::kernels::cuda
