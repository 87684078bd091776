// CUDA kernels of the FP8 family (Note [FP8 scaling]): the scaled cast with
// its amax in one pass, and the scale rule on one thread.
//
// Note [FP8 cast kernel]
// ~~~~~~~~~~~~~~~~~~~~~~
// A grid-stride loop over x: each thread multiplies in f32, rounds through
// cuda_fp8.h's satfinite conversion (the bytes of core's host encoder, Note
// [FP8 dtypes]) and keeps the largest |x| it saw as the bits of a
// non-negative float, NaN as 0x7fc00000, which compares above every finite
// value and infinity. The block reduces these with a warp max and a shared
// array, and one atomicMax per block merges them into amax, zeroed before the
// launch. An unsigned max is exact and order-free, so amax is the same bits
// whatever the blocks' order (Note [Determinism]). Not yet measured against
// the copy rate; 16-byte packs are the obvious next step.
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kNanBits = 0x7fc00000u;

__device__ __forceinline__ uint32_t abs_bits(float v) {
  const float a = fabsf(v);
  return isnan(a) ? kNanBits : __float_as_uint(a);
}

template <class T, class Q>
__global__ void __launch_bounds__(kThreads)
    cast_to_fp8_kernel(const T* __restrict__ x, const float* __restrict__ scale, Q* __restrict__ q,
                       uint32_t* __restrict__ amax_bits, int64_t n) {
  const float s = *scale;
  uint32_t local = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = cu::convert<float>(x[i]);
    local = max(local, abs_bits(v));
    q[i] = Q(v * s);  // __NV_SATFINITE, round to nearest even
  }
  local = __reduce_max_sync(0xffffffffu, local);
  __shared__ uint32_t warp_max[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = local;
  __syncthreads();
  if (warp == 0) {
    uint32_t m = lane < kThreads / 32 ? warp_max[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0 && m != 0u) atomicMax(amax_bits, m);
  }
}

// Note [FP8 block scaling]: one block per tile, kBlockThreads threads
// spanning a tile row; the tile is read twice (its amax, then the cast), the
// second read from L2 for tiles up to 128 x 128 x 4 bytes. Not yet measured.
constexpr int kBlockThreads = 128;

// The max over the block's threads (a multiple of 32, numbered x first),
// returned to every thread; shared holds one word per warp.
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* shared) {
  v = __reduce_max_sync(0xffffffffu, v);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int warps = static_cast<int>(blockDim.x * blockDim.y / 32);
  if (tid % 32 == 0) shared[tid / 32] = v;
  __syncthreads();
  uint32_t m = 0;
  for (int w = 0; w < warps; ++w)
    m = max(m, shared[w]);
  return m;
}

// Note [FP8 cast-transpose]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// q and q^T from one read of x: a block of 32 x 8 threads takes 32 x 32
// tiles grid-stride, casts each element once (the codes of cast_to_fp8),
// writes q along rows and keeps the codes in shared memory, then writes q^T
// along its rows from the tile (rows padded so the column reads meet no bank
// twice). amax as Note [FP8 cast kernel]. Byte stores, not yet measured:
// packing four codes per store is the obvious next step.
constexpr int kTransposeTile = 32;
constexpr int kTransposeRows = 8;

template <class T, class Q>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRows)
    cast_transpose_kernel(const T* __restrict__ x, int64_t m, int64_t k,
                          const float* __restrict__ scale, uint8_t* __restrict__ q,
                          uint8_t* __restrict__ q_t, uint32_t* __restrict__ amax_bits) {
  __shared__ uint8_t tile[kTransposeTile][kTransposeTile + 4];
  __shared__ uint32_t warp_max[kTransposeRows];
  const float s = *scale;
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
  const uint32_t block = block_max(local, warp_max);
  if (threadIdx.x == 0 && threadIdx.y == 0 && block != 0u) atomicMax(amax_bits, block);
}

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

__global__ void scale_rule_kernel(const float* amax, float fp8_max, int margin, bool power_of_two,
                                  float* scale, float* scale_inv) {
  const float s = fp8_scale_rule(*amax, fp8_max, margin, power_of_two);
  *scale = s;
  *scale_inv = 1.0f / s;
}

template <class F>
void visit_fp8(DType t, F&& f) {
  using cu::device_t;
  switch (t) {
    ACCRUE_FOR_EACH_FP8_DTYPE(ACCRUE_DEVICE_DTYPE_CASE)
    default:
      ACCRUE_FAIL("cast_to_fp8: dtype ", dtype_name(t), " is not an FP8 dtype");
  }
}

}  // namespace

void cast_to_fp8(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& amax) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t n = x.numel();
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  cu::visit_float_dtype(x.dtype(), "cast_to_fp8", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), [&](auto qtag) {
      using Q = decltype(qtag);
      cast_to_fp8_kernel<T, Q><<<cu::grid_for(n, kThreads, 65535), kThreads, 0, stream>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const float*>(scale.data_ptr()),
          static_cast<Q*>(q.data_ptr()), static_cast<uint32_t*>(amax.data_ptr()), n);
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

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
      cast_blockwise_kernel<T, Q><<<static_cast<unsigned>(tiles), kBlockThreads, 0, stream>>>(
          static_cast<const T*>(x.data_ptr()), x.size(0), x.size(1), tile_rows, tile_cols,
          scale_inv.size(1), fp8_max, power_of_two, static_cast<Q*>(q.data_ptr()),
          static_cast<float*>(scale_inv.data_ptr()), static_cast<uint32_t*>(amax.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void cast_to_fp8_transpose(const Tensor& x, const Tensor& scale, const Tensor& q, const Tensor& q_t,
                           const Tensor& amax) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t tiles =
      (m + kTransposeTile - 1) / kTransposeTile * ((k + kTransposeTile - 1) / kTransposeTile);
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  cu::visit_float_dtype(x.dtype(), "cast_to_fp8_transpose", [&](auto tag) {
    using T = decltype(tag);
    visit_fp8(q.dtype(), [&](auto qtag) {
      using Q = decltype(qtag);
      const dim3 block(kTransposeTile, kTransposeRows);
      cast_transpose_kernel<T, Q><<<cu::grid_for(tiles, 1, 65535), block, 0, stream>>>(
          static_cast<const T*>(x.data_ptr()), m, k, static_cast<const float*>(scale.data_ptr()),
          static_cast<uint8_t*>(q.data_ptr()), static_cast<uint8_t*>(q_t.data_ptr()),
          static_cast<uint32_t*>(amax.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, bool power_of_two,
                         const Tensor& scale, const Tensor& scale_inv) {
  const int dev = amax.device().index;
  cu::DeviceScope scope(dev);
  scale_rule_kernel<<<1, 1, 0, cu::stream_for(dev)>>>(
      static_cast<const float*>(amax.data_ptr()), fp8_max, margin, power_of_two,
      static_cast<float*>(scale.data_ptr()), static_cast<float*>(scale_inv.data_ptr()));
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
