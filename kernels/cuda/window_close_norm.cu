// The CUDA window close's norm partials (kernels/cuda/window_close.cuh):
// the sum of squares and the non-finite count of the gradient arena, row by
// row, in one read at memory speed.
#include <algorithm>
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/elementwise_ops.cuh"  // Pack, load_pack, pack_aligned
#include "accrue/kernels/cuda/window_close.cuh"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels::cuda {
namespace {

// ---- (a) the norm partials ------------------------------------------------------------------

// Note [Norm partials]
// ~~~~~~~~~~~~~~~~~~~~
// One read of the gradient arena gives the sum of squares and the count of
// non-finite elements, bit for bit the same on every run (Note [Determinism]):
// the order of every addition is fixed by the arena's size and the GPU's SM
// count alone.
//  - The arena is cut in packs of 16 bytes (4 floats or 2 doubles). A fixed
//    grid of `rows` blocks (norm_plan: at most kNormBlocksPerSm per SM, so one
//    wave, all resident) gives block b the contiguous packs
//    [b * packs_per_row, (b + 1) * packs_per_row), cut at the end.
//  - In a block, thread t takes packs t, t + T, t + 2T, ... (T threads), loading
//    kNormUnroll of them before using any: 64 bytes in flight per thread, enough
//    to cover the memory latency at full bandwidth. Each element is widened to
//    f64, squared and added in index order; non-finite ones are counted.
//  - The threads combine through a fixed warp butterfly, then warp by warp in
//    order; the block writes row b = (sum of squares, non-finite count).
//  - The few elements after the last whole pack go to row 0's thread 0.
//  - A launch may compute any range of rows (block b computes row
//    first_row + b): the same code on the same elements, so the same bits
//    (Note [Norm rows]).
// A misaligned arena is read with scalar loads in the same pattern: slower,
// same result. The scalar step folds the rows in order.
constexpr int kNormThreads = 512;
constexpr int kNormBlocksPerSm = 2;
constexpr int kNormUnroll = 4;
constexpr int kNormWarps = kNormThreads / 32;

struct NormPlan {
  int64_t rows;
  int64_t packs_per_row;
};

NormPlan norm_plan(int64_t numel, DType dtype, int sms) {
  const int64_t packs = numel / static_cast<int64_t>(16 / element_size(dtype));
  if (packs == 0) return {1, 0};
  const int64_t tile = int64_t{kNormThreads} * kNormUnroll;
  const int64_t max_rows = std::max<int64_t>(1, int64_t{sms} * kNormBlocksPerSm);
  const int64_t rows = std::clamp<int64_t>((packs + tile - 1) / tile, 1, max_rows);
  // A whole number of block widths per row keeps every block's start aligned.
  int64_t per_row = (packs + rows - 1) / rows;
  per_row = (per_row + kNormThreads - 1) / kNormThreads * kNormThreads;
  return {(packs + per_row - 1) / per_row, per_row};
}

// Pack k of p, with one 16-byte load when the arena is aligned.
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_any(const T* p, int64_t k, bool vectorized) {
  if (vectorized) return load_pack<V>(p, k);
  Pack<T, V> x;
#pragma unroll
  for (int j = 0; j < V; ++j)
    x.v[j] = p[k * V + j];
  return x;
}

template <class T>
__device__ __forceinline__ void add_square(T x, double& sumsq, unsigned& nonfinite) {
  const double d = static_cast<double>(x);
  sumsq += d * d;
  nonfinite += std::isfinite(x) ? 0u : 1u;
}

template <class T>
__global__ void __launch_bounds__(kNormThreads, kNormBlocksPerSm)
    grad_norm_partials_kernel(const T* __restrict__ grads, int64_t n, int64_t packs_per_row,
                              int64_t first_row, bool vectorized, double* __restrict__ partials) {
  constexpr int V = 16 / sizeof(T);
  const int64_t packs = n / V;
  const int64_t row = first_row + blockIdx.x;  // Note [Norm rows]: launched by ranges
  const int64_t begin = row * packs_per_row;
  const int64_t end = begin + packs_per_row < packs ? begin + packs_per_row : packs;
  double sumsq = 0.0;
  unsigned nonfinite = 0;
  for (int64_t base = begin + threadIdx.x; base < end; base += kNormThreads * kNormUnroll) {
    Pack<T, V> x[kNormUnroll];
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) {
      const int64_t k = base + static_cast<int64_t>(u) * kNormThreads;
      x[u] = k < end ? load_any<V>(grads, k, vectorized) : Pack<T, V>{};  // zeros add nothing
    }
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        add_square(x[u].v[j], sumsq, nonfinite);
    }
  }
  if (row == 0 && threadIdx.x == 0) {
    for (int64_t i = packs * V; i < n; ++i)
      add_square(grads[i], sumsq, nonfinite);
  }

#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    sumsq += __shfl_xor_sync(kFullMask, sumsq, m);
    nonfinite += __shfl_xor_sync(kFullMask, nonfinite, m);
  }
  __shared__ double warp_sumsq[kNormWarps];
  __shared__ unsigned warp_nonfinite[kNormWarps];
  if (threadIdx.x % 32 == 0) {
    warp_sumsq[threadIdx.x / 32] = sumsq;
    warp_nonfinite[threadIdx.x / 32] = nonfinite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0, bad = 0.0;
    for (int w = 0; w < kNormWarps; ++w) {
      total += warp_sumsq[w];
      bad += static_cast<double>(warp_nonfinite[w]);
    }
    partials[2 * row] = total;
    partials[2 * row + 1] = bad;
  }
}

template <class T>
void norm_partials_typed(const Tensor& grads, const Tensor& partials, int64_t first_row,
                         int64_t rows) {
  constexpr int V = 16 / sizeof(T);
  const int device = grads.device().index;
  dev::DeviceScope scope(device);
  const NormPlan plan = norm_plan(grads.numel(), grads.dtype(), sm_count(device));
  const T* g = static_cast<const T*>(grads.data_ptr());
  grad_norm_partials_kernel<T>
      <<<static_cast<unsigned>(rows), kNormThreads, 0, dev::stream_for(device)>>>(
          g, grads.numel(), plan.packs_per_row, first_row, pack_aligned<V>(g),
          partials.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

int64_t norm_partials_rows(int64_t numel, DType dtype, int device) {
  return norm_plan(numel, dtype, sm_count(device)).rows;
}

int64_t norm_row_elements(int64_t numel, DType dtype, int device) {
  const NormPlan plan = norm_plan(numel, dtype, sm_count(device));
  // An arena too small for one pack is one row of its few elements.
  return plan.packs_per_row > 0
             ? plan.packs_per_row * static_cast<int64_t>(16 / element_size(dtype))
             : std::max<int64_t>(numel, 1);
}

void grad_norm_partials(const Tensor& grads, const Tensor& partials, int64_t first_row,
                        int64_t rows) {
  if (grads.dtype() == DType::f64) {
    norm_partials_typed<double>(grads, partials, first_row, rows);
  } else {
    norm_partials_typed<float>(grads, partials, first_row, rows);
  }
}

}  // namespace accrue::kernels::cuda
