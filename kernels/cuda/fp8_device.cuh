// The device helpers the FP8 cast kernels share (kernels/cuda/fp8.cu,
// kernels/cuda/fp8_block_transpose.cu): the amax as the bits of a
// non-negative float (Note [FP8 cast kernel] in fp8.cu), the block max and
// its one atomic, the capped grid, the FP8 dtype visitor.
#pragma once

#include <cstdint>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda::fp8_device {

namespace cu = ::accrue::cuda;

constexpr int kThreads = 256;
constexpr uint32_t kNanBits = 0x7fc00000u;

__device__ __forceinline__ uint32_t abs_bits(float v) {
  const float a = fabsf(v);
  return isnan(a) ? kNanBits : __float_as_uint(a);
}

// Blocks per SM for the grid-stride kernels: enough to keep the loads in
// flight, few enough that the per-block atomics do not queue.
constexpr int kBlocksPerSm = 8;

// The grid of a grid-stride loop over `items` with kThreads per block.
inline unsigned capped_grid(int64_t items, int device) {
  return cu::grid_for(items, kThreads, int64_t{kBlocksPerSm} * cu::sm_count(device));
}

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

// Merges each thread's max bits into *amax_bits: the block's max, then one
// atomicMax per block (Note [FP8 cast kernel]). Every thread of the block
// must call it.
__device__ __forceinline__ void merge_amax(uint32_t local, uint32_t* amax_bits) {
  __shared__ uint32_t warp_max[32];
  const uint32_t m = block_max(local, warp_max);
  if (threadIdx.x == 0 && threadIdx.y == 0 && m != 0u) atomicMax(amax_bits, m);
}

template <class F>
inline void visit_fp8(DType t, F&& f) {
  using cu::device_t;
  switch (t) {
    ACCRUE_FOR_EACH_FP8_DTYPE(ACCRUE_DEVICE_DTYPE_CASE)
    default:
      ACCRUE_FAIL("cast_to_fp8: dtype ", dtype_name(t), " is not an FP8 dtype");
  }
}

}  // namespace accrue::kernels::cuda::fp8_device
