// CUDA kernels of the FP8 family (Note [FP8 scaling]): the scaled cast with
// its amax in one pass, and the scale rule on one thread.
//
// Note [FP8 cast kernel]
// ~~~~~~~~~~~~~~~~~~~~~~
// A grid-stride loop over x in 16-byte packs (8 bf16/f16 or 4 f32 values;
// one element at a time when x or q is not aligned for them): each thread
// multiplies in f32, rounds through cuda_fp8.h's satfinite conversion (the
// bytes of core's host encoder, Note [FP8 dtypes]), stores the pack's codes
// as one 8- or 4-byte word and keeps the largest |x| it saw as the bits of a
// non-negative float, NaN as 0x7fc00000, which compares above every finite
// value and infinity. The block reduces these with a warp max and a shared
// array, and one atomicMax per block merges them into amax, zeroed before the
// launch. An unsigned max is exact and order-free, so amax is the same bits
// whatever the blocks' order (Note [Determinism]). The grid is capped at a
// few blocks per SM: a block per 256 elements (the first version, 65,535
// blocks on a 25 MB tensor) queued tens of thousands of atomics on one
// address and ran at a third of the copy rate (measured with ncu on an H200,
// 27.8 us for what moves in 9); capped and packed, the cast runs at 0.86 of
// the copy rate and fp8_amax at 0.83 (16384 x 4096 bf16, bench/RESULTS.md).
// fp8_amax is the same loop without the codes: current scaling reads x once
// for its amax before the cast reads it again.
#include <cstdint>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/column_sums.cuh"
#include "accrue/kernels/cuda/fp8_device.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

using namespace fp8_device;  // NOLINT: the family's shared helpers

// V elements per pack (V = 1: element by element). With Q = void only the
// amax is taken (fp8_amax). n elements; packs of V cover n / V * V of them
// and the rest (fewer than V) go one per thread.
template <class T, class Q, int V>
__global__ void __launch_bounds__(kThreads)
    cast_to_fp8_kernel(const T* __restrict__ x, const float* __restrict__ scale,
                       uint8_t* __restrict__ q, uint32_t* __restrict__ amax_bits, int64_t n) {
  constexpr bool kCodes = !std::is_void_v<Q>;
  float s = 1.0f;
  if constexpr (kCodes) s = *scale;
  uint32_t local = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = first; i < packs; i += stride) {
    const cu::Pack<T, V> in = cu::load_pack<V>(x, i);
    if constexpr (kCodes) {
      cu::Pack<uint8_t, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float v = cu::convert<float>(in.v[j]);
        local = max(local, abs_bits(v));
        out.v[j] = Q(v * s).__x;  // __NV_SATFINITE, round to nearest even
      }
      cu::store_pack<V>(q, i, out);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        local = max(local, abs_bits(cu::convert<float>(in.v[j])));
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    const float v = cu::convert<float>(x[i]);
    local = max(local, abs_bits(v));
    if constexpr (kCodes) q[i] = Q(v * s).__x;
  }
  merge_amax(local, amax_bits);
}

// Launches cast_to_fp8_kernel<T, Q, V> with the widest V that x and q allow.
template <class T, class Q>
void launch_cast(const T* x, const float* scale, uint8_t* q, uint32_t* amax_bits, int64_t n,
                 int device, cudaStream_t stream) {
  constexpr int kV = 16 / sizeof(T);
  const bool packed = cu::pack_aligned<kV>(x) && (q == nullptr || cu::pack_aligned<kV>(q));
  if (packed) {
    cast_to_fp8_kernel<T, Q, kV>
        <<<capped_grid(n / kV, device), kThreads, 0, stream>>>(x, scale, q, amax_bits, n);
  } else {
    cast_to_fp8_kernel<T, Q, 1>
        <<<capped_grid(n, device), kThreads, 0, stream>>>(x, scale, q, amax_bits, n);
  }
  ACCRUE_LAUNCH_CHECK();
}

// Where a cast-transpose takes its scale: *scale, or, with scale null, the
// current-scaling rule over *amax (cast_to_fp8_transpose_scaled), whose
// scale_inv the block of index 0 writes, in the f32 operations of
// scale_rule_kernel. amax_bits null: no amax is taken.
struct ScaleSource {
  const float* scale;
  const float* amax;
  float fp8_max;
  int margin;
  bool power_of_two, guard;
  float* scale_inv;
};

__device__ __forceinline__ float resolve_scale(const ScaleSource& src) {
  if (src.scale != nullptr) return *src.scale;
  const float a = *src.amax;
  const float s = fp8_scale_rule(a, src.fp8_max, src.margin, src.power_of_two);
  if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0)
    *src.scale_inv = fp8_inverse_scale(a, s, src.guard);
  return s;
}

// Note [FP8 cast-transpose]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// q and q^T from one read of x, in 64 x 64 tiles taken grid-stride by
// blocks of 256 threads (the grid capped as Note [FP8 cast kernel]'s, one
// atomicMax per block). Each thread reads a 16-byte pack of a tile row,
// casts it (the codes of cast_to_fp8), writes its codes to q as one word and
// to a shared tile; then each thread gathers 8 codes down a tile column and
// writes them to q^T as one 8-byte word, eight threads covering 64 bytes of
// a q^T row. Rows of the shared tile are padded to 68 bytes, so the column
// gathers meet a bank at most twice. That needs K a multiple of the pack
// (8 for bf16/f16, 4 for f32), M a multiple of 8 and aligned buffers, which
// every FP8 GEMM operand satisfies (Note [FP8 GEMM]: multiples of 16);
// other shapes take a 32 x 32 tile element by element (the first version,
// byte stores, at 0.2-0.4 of the copy rate on an H200; this one 0.76).
//
// Note [FP8 bias gradient in the cast]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A linear layer's bias gradient is the column sums of dy, which the cast of
// dy reads whole anyway; as its own pass (sum_rows) it re-read every biased
// dy: 14 ms of a GPT-2 1.5B FP8 window of 542 under ncu (bench/RESULTS.md,
// seventh session). With column sums, each thread of the packed kernel sums
// its pack's columns over its rows of a tile, the block adds those in row
// order into the tile's 64 column sums, written to partial[row tile][col];
// column_total adds the row tiles into dbias in an order fixed by the shape
// (or onto it, the fp32 slot's accumulation, Note [Fused weight-gradient
// accumulation]; Note [Deterministic column sums]: a first version gave each
// column one thread over every tile, 768 threads on 3 SMs at GPT-2 124M, and
// made the window 1.5-1.9% slower than the separate pass, bench/RESULTS.md,
// eighth session). No
// atomics, and no sum depends on which block took a tile: the same bits on
// every run and grid (Note [Determinism]). The order is not sum_rows', so
// the bits differ from the separate pass by f32 rounding. The element-by-
// element fallback takes none: the caller then runs sum_rows.
constexpr int kTile = 64;
constexpr int kTilePad = 4;

template <class T, class Q, bool kColumnSums>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_packed_kernel(const T* __restrict__ x, int64_t m, int64_t k, ScaleSource src,
                                 uint8_t* __restrict__ q, uint8_t* __restrict__ q_t,
                                 uint32_t* __restrict__ amax_bits, float* __restrict__ partial) {
  constexpr int V = 16 / sizeof(T);        // elements per pack
  constexpr int kPacksPerRow = kTile / V;  // packs per tile row
  constexpr int kRowsPerPass = kThreads / kPacksPerRow;
  constexpr int kChunk = 8;  // codes per q^T store
  constexpr int kColsPerPass = kThreads / (kTile / kChunk);
  __shared__ __align__(16) uint8_t tile[kTile][kTile + kTilePad];
  // Note [FP8 bias gradient in the cast]: each thread's sums of its pack's columns over its
  // rows of the tile, then the tile's column sums in a fixed order.
  [[maybe_unused]] __shared__ float sums[kColumnSums ? kRowsPerPass : 1][kColumnSums ? kTile : 1];
  const float s = resolve_scale(src);
  const int64_t tiles_k = (k + kTile - 1) / kTile;
  const int64_t tiles = (m + kTile - 1) / kTile * tiles_k;
  const int pack = threadIdx.x % kPacksPerRow, chunk = threadIdx.x % (kTile / kChunk);
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_k) * kTile, c0 = (t % tiles_k) * kTile;
    const int64_t c = c0 + pack * V;
    [[maybe_unused]] float column[kColumnSums ? V : 1] = {};
    for (int j = threadIdx.x / kPacksPerRow; j < kTile; j += kRowsPerPass) {
      const int64_t r = r0 + j;
      if (r >= m || c >= k) continue;  // K % V == 0: a pack is all in or all out
      const cu::Pack<T, V> in = cu::load_pack<V>(x + r * k + c, 0);
      cu::Pack<uint8_t, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float v = cu::convert<float>(in.v[e]);
        local = max(local, abs_bits(v));
        out.v[e] = Q(v * s).__x;
        if constexpr (kColumnSums) column[e] += v;
      }
      cu::store_pack<V>(q + r * k + c, 0, out);
#pragma unroll
      for (int w = 0; w < V / 4; ++w)  // tile rows are 4-byte aligned
        reinterpret_cast<uint32_t*>(&tile[j][pack * V])[w] =
            reinterpret_cast<const uint32_t*>(out.v)[w];
    }
    if constexpr (kColumnSums) {
#pragma unroll
      for (int e = 0; e < V; ++e)
        sums[threadIdx.x / kPacksPerRow][pack * V + e] = column[e];
    }
    __syncthreads();
    if constexpr (kColumnSums) {
      if (threadIdx.x < kTile && c0 + threadIdx.x < k) {
        float total = 0.0f;
        for (int j = 0; j < kRowsPerPass; ++j)
          total += sums[j][threadIdx.x];
        partial[(r0 / kTile) * k + c0 + threadIdx.x] = total;
      }
    }
    const int64_t r = r0 + chunk * kChunk;  // M % 8 == 0: a chunk is all in or all out
    for (int jc = threadIdx.x / (kTile / kChunk); jc < kTile; jc += kColsPerPass) {
      const int64_t col = c0 + jc;  // row col of q^T, columns r .. r + 7
      if (col >= k || r >= m) continue;
      cu::Pack<uint8_t, kChunk> out;
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        out.v[e] = tile[chunk * kChunk + e][jc];
      cu::store_pack<kChunk>(q_t + col * m + r, 0, out);
    }
    __syncthreads();
  }
  if (amax_bits != nullptr) merge_amax(local, amax_bits);  // uniform over the block
}

// The element-by-element fallback for shapes and buffers the packed kernel
// cannot take.
constexpr int kTransposeTile = 32;
constexpr int kTransposeRows = 8;

template <class T, class Q>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRows)
    cast_transpose_scalar_kernel(const T* __restrict__ x, int64_t m, int64_t k, ScaleSource src,
                                 uint8_t* __restrict__ q, uint8_t* __restrict__ q_t,
                                 uint32_t* __restrict__ amax_bits) {
  __shared__ uint8_t tile[kTransposeTile][kTransposeTile + 4];
  const float s = resolve_scale(src);
  const int64_t tiles_k = (k + kTransposeTile - 1) / kTransposeTile;
  const int64_t tiles = (m + kTransposeTile - 1) / kTransposeTile * tiles_k;
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_k) * kTransposeTile, c0 = (t % tiles_k) * kTransposeTile;
    for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < m && c < k) {
        const float v = cu::convert<float>(x[r * k + c]);
        local = max(local, abs_bits(v));
        const uint8_t code = Q(v * s).__x;
        q[r * k + c] = code;
        tile[j][threadIdx.x] = code;
      }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;  // row c of q^T, column r
      if (c < k && r < m) q_t[c * m + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
  if (amax_bits != nullptr) merge_amax(local, amax_bits);  // uniform over the block
}

__global__ void scale_rule_kernel(const float* amax, float fp8_max, int margin, bool power_of_two,
                                  bool guard, float* scale, float* scale_inv) {
  const float a = *amax;
  const float s = fp8_scale_rule(a, fp8_max, margin, power_of_two);
  *scale = s;
  *scale_inv = fp8_inverse_scale(a, s, guard);
}

}  // namespace

void cast_to_fp8(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& amax) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  cu::visit_float_dtype(x.dtype(), "cast_to_fp8", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), [&](auto qtag) {
      launch_cast<T, decltype(qtag)>(
          static_cast<const T*>(x.data_ptr()), static_cast<const float*>(scale.data_ptr()),
          static_cast<uint8_t*>(q.data_ptr()), static_cast<uint32_t*>(amax.data_ptr()), x.numel(),
          dev, stream);
    });
  });
}

void fp8_amax(const Tensor& x, const Tensor& amax) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  cu::visit_float_dtype(x.dtype(), "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    launch_cast<T, void>(static_cast<const T*>(x.data_ptr()), nullptr, nullptr,
                         static_cast<uint32_t*>(amax.data_ptr()), x.numel(), dev, stream);
  });
}

namespace {

// Note [FP8 cast-transpose]: the packed kernel where the shape and buffers
// allow it, else the element-by-element one. With dbias (f32 [K]), the
// column sums of x as well (Note [FP8 bias gradient in the cast]).
// Returns whether it wrote dbias: the fallback does not take column sums.
bool launch_cast_transpose(const Tensor& x, const ScaleSource& src, const Tensor& q,
                           const Tensor& q_t, uint32_t* amax_bits, int dev, cudaStream_t stream,
                           const Tensor& dbias = Tensor(), bool dbias_accumulate = false) {
  bool sums_written = false;
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t tiles =
      (m + kTransposeTile - 1) / kTransposeTile * ((k + kTransposeTile - 1) / kTransposeTile);
  cu::visit_float_dtype(x.dtype(), "cast_to_fp8_transpose", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), [&](auto qtag) {
      using Q = decltype(qtag);
      const auto* px = static_cast<const T*>(x.data_ptr());
      auto* pq = static_cast<uint8_t*>(q.data_ptr());
      auto* pt = static_cast<uint8_t*>(q_t.data_ptr());
      constexpr int kV = 16 / sizeof(T);
      if (k % kV == 0 && m % 8 == 0 && cu::pack_aligned<kV>(px) && cu::pack_aligned<kV>(pq) &&
          cu::pack_aligned<8>(pt)) {
        const int64_t tiles_m = (m + kTile - 1) / kTile;
        const dim3 grid = cu::grid_for(tiles_m * ((k + kTile - 1) / kTile), 1,
                                       int64_t{kBlocksPerSm} * cu::sm_count(dev));
        if (!dbias.defined()) {
          cast_transpose_packed_kernel<T, Q, false>
              <<<grid, kThreads, 0, stream>>>(px, m, k, src, pq, pt, amax_bits, nullptr);
        } else {
          const Tensor partial = empty({tiles_m, k}, DType::f32, x.device());
          cast_transpose_packed_kernel<T, Q, true><<<grid, kThreads, 0, stream>>>(
              px, m, k, src, pq, pt, amax_bits, static_cast<float*>(partial.data_ptr()));
          ACCRUE_LAUNCH_CHECK();
          // Note [FP8 bias gradient in the cast]: the row tiles' partials summed
          // in an order fixed by the shape (Note [Deterministic column sums]).
          column_total<float, float>(partial, tiles_m, k, static_cast<float*>(dbias.data_ptr()), 1,
                                     dbias_accumulate, stream);
          sums_written = true;
        }
      } else {
        const dim3 block(kTransposeTile, kTransposeRows);
        cast_transpose_scalar_kernel<T, Q>
            <<<cu::grid_for(tiles, 1, int64_t{kBlocksPerSm} * cu::sm_count(dev)), block, 0,
               stream>>>(px, m, k, src, pq, pt, amax_bits);
      }
      ACCRUE_LAUNCH_CHECK();
    });
  });
  return sums_written;
}

}  // namespace

void cast_to_fp8_transpose(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& q_t,
                           const Tensor& amax, bool merge_amax) {
  cast_to_fp8_transpose_dbias(x, scale, q, q_t, amax, merge_amax, Tensor(), false);
}

void cast_to_fp8_transpose_scaled(const Tensor& x, const Tensor& amax, float fp8_max, int margin,
                                  bool power_of_two, bool guard, const Tensor& q, const Tensor& q_t,
                                  const Tensor& scale_inv) {
  cast_to_fp8_transpose_scaled_dbias(x, amax, fp8_max, margin, power_of_two, guard, q, q_t,
                                     scale_inv, Tensor(), false);
}

bool cast_to_fp8_transpose_dbias(const Tensor& x, const Tensor& scale, const Tensor& q,
                                 const Tensor& q_t, const Tensor& amax, bool merge_amax,
                                 const Tensor& dbias, bool dbias_accumulate) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  // merge_amax: the blocks' atomicMax onto the running value (NaN's bits
  // compare above every other, so it stays).
  if (!merge_amax) ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  ScaleSource src{};
  src.scale = static_cast<const float*>(scale.data_ptr());
  return launch_cast_transpose(x, src, q, q_t, static_cast<uint32_t*>(amax.data_ptr()), dev, stream,
                               dbias, dbias_accumulate);
}

bool cast_to_fp8_transpose_scaled_dbias(const Tensor& x, const Tensor& amax, float fp8_max,
                                        int margin, bool power_of_two, bool guard, const Tensor& q,
                                        const Tensor& q_t, const Tensor& scale_inv,
                                        const Tensor& dbias, bool dbias_accumulate) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const ScaleSource src{
      nullptr, static_cast<const float*>(amax.data_ptr()), fp8_max, margin, power_of_two,
      guard,   static_cast<float*>(scale_inv.data_ptr())};
  return launch_cast_transpose(x, src, q, q_t, nullptr, dev, cu::stream_for(dev), dbias,
                               dbias_accumulate);
}

void fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, bool power_of_two,
                         bool guard, const Tensor& scale, const Tensor& scale_inv) {
  const int dev = amax.device().index;
  cu::DeviceScope scope(dev);
  scale_rule_kernel<<<1, 1, 0, cu::stream_for(dev)>>>(
      static_cast<const float*>(amax.data_ptr()), fp8_max, margin, power_of_two, guard,
      static_cast<float*>(scale.data_ptr()), static_cast<float*>(scale_inv.data_ptr()));
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
