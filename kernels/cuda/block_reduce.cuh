// Device helpers shared by the CUDA kernels that reduce along a row: math
// overloads for the accumulation type, warp / block reductions, and the
// one-block totals of a loss.
//
// Every reduction here is in a fixed order (Note [Determinism] in
// kernels/backend.h): a butterfly over the warp, then the warps' partials in
// warp order, so a block gives the same bits on every run.
#pragma once

#include <cmath>

#include "accrue/core/cuda_types.cuh"

namespace accrue::kernels::cuda::reduce {

__device__ __forceinline__ float exp_(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_(double x) {
  return exp(x);
}
__device__ __forceinline__ float log_(float x) {
  return logf(x);
}
__device__ __forceinline__ double log_(double x) {
  return log(x);
}
__device__ __forceinline__ float sqrt_(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double sqrt_(double x) {
  return sqrt(x);
}
template <class A>
__device__ __forceinline__ A max_(A a, A b) {
  return a > b ? a : b;
}

// A storage value widened to the accumulation type A.
template <class A, class T>
__device__ __forceinline__ A load(T v) {
  return ::accrue::cuda::convert<A>(v);
}

// Butterfly reductions over a warp. Every lane ends with the same bits: each
// step combines the same two partials, only in swapped operand order, which
// is exact.
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = max_(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum / max over a block whose size is a multiple of 32, returned to every
// thread, in a fixed order. `scratch` is shared memory of at least 32
// elements; the leading barrier lets a caller reuse it right after a previous
// reduction.
template <class A>
__device__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : A(0);
  return warp_sum(v);
}
template <class A>
__device__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : static_cast<A>(-INFINITY);
  return warp_max(v);
}

// A loss's two totals, in one block: *sum = the row losses, *count =
// #(targets != ignore_index), both in a fixed order (each thread a fixed
// stride of rows, then the block tree). Shared by cross_entropy and the fused
// classifier. Internal to each including file, as a kernel defined there
// would be (one registration per translation unit).
namespace {
template <class I, class A>
__global__ void loss_total_kernel(const A* __restrict__ row_loss, const I* __restrict__ targets,
                                  int64_t rows, int64_t ignore_index, A* __restrict__ sum,
                                  int64_t* __restrict__ count) {
  __shared__ A scratch_loss[32];
  __shared__ long long scratch_count[32];
  A loss = 0;
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    loss += row_loss[r];
    counted += static_cast<int64_t>(targets[r]) != ignore_index;
  }
  loss = block_sum(loss, scratch_loss);
  counted = block_sum(counted, scratch_count);
  if (threadIdx.x == 0) {
    *sum = loss;
    *count = counted;
  }
}
}  // namespace

}  // namespace accrue::kernels::cuda::reduce
