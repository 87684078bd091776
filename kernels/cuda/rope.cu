// CUDA rotary position embedding (Note [Rotary embedding], kernels/fused.h),
// forward and backward (the rotation by -angle).
#include <cstdint>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/fused_backend.h"

namespace accrue::kernels::cuda {

namespace {

namespace cu = ::accrue::cuda;
using cu::load_pack;
using cu::Pack;
using cu::store_pack;

constexpr int kRopeThreads = 128;
// inv_freq held in shared memory (pairs of a head past it are computed in place).
constexpr int kRopeTable = 256;
// Heads whose packs a thread loads before it rotates and stores any of them.
constexpr int kHeadBatch = 4;

__device__ __forceinline__ void sincos_of(float a, float* s, float* c) {
  sincosf(a, s, c);
}
__device__ __forceinline__ void sincos_of(double a, double* s, double* c) {
  sincos(a, s, c);
}

// Note [Rotary kernel]
// ~~~~~~~~~~~~~~~~~~~~
// A work item is one token's V pairs (V-element packs at i and i + D/2 for
// RotateHalf, the 2V elements from 2i for Interleaved; 16-byte packs where
// D/2, the strides and the pointers allow it, else V = 1) in EVERY head: the
// thread computes the V angles' cos and sin once, then rotates the pairs of
// the token's heads, kHeadBatch heads' packs loaded before any is stored, so
// each thread keeps 2 x kHeadBatch loads in flight. Consecutive threads take
// consecutive packs of a token, then the next token: a warp's loads are whole
// 32-byte sectors. inv_freq does not depend on the token: a block computes it
// once into shared memory (one barrier, before the grid-stride loop).
//
// The kernel before this one (a block per token, the token's cos and sin
// into shared memory between barriers, then every thread a pack of one head)
// ran at 0.56 of the copy rate on an H200 and 0.67 on an H100 at 8 x 2048 x
// 32 x 128: three barriers a token, and two loads in flight a thread between
// them; torch.compile's kernel of the same formula ran at 0.93.
//
// x is read through its strides (a view of a packed qkv), out through its own
// (x itself for the in-place rope_): a thread reads each element before it
// writes it, and no other thread touches it, hence no __restrict__ on either.
// So the compiler cannot move a head's loads above the previous head's stores
// (they might alias): the batch of kHeadBatch heads is what puts several
// loads in flight.
// This kernel runs at 0.58-0.60 of the copy rate (bf16, 8 x 2048 x 32 x 128,
// H200). Measured beside it (2026-11-28, bench/RESULTS.md): a thread per 4 or
// 8 heads' packs, the angles computed per group, 0.46 and 0.43; kHeadBatch 2,
// 0.57; registers capped at 64-80 (spills), 0.31-0.37. Sharing the angles
// over every head is worth more than the threads or occupancy it costs.
template <class T, int V, bool kInterleaved>
__global__ void rope_kernel(const T* x, const int64_t* __restrict__ positions, int64_t tokens,
                            int64_t t_n, int64_t h_n, int64_t d, int64_t sb, int64_t st, int64_t sh,
                            int64_t pb, int64_t pt, double theta, RopeScaling scaling, bool inverse,
                            T* out, int64_t out_sb, int64_t out_st, int64_t out_sh) {
  using F = cu::math_t<T>;
  __shared__ F inv_freq[kRopeTable];
  const int64_t half = d / 2;
  const bool table = half <= kRopeTable;
  if (table) {
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x)
      inv_freq[i] = rope_inv_freq<F>(i, d, theta, scaling);
    __syncthreads();
  }
  const int64_t packs = half / V;  // work items of a token
  const int64_t items = tokens * packs;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tok = it / packs, i0 = (it - tok * packs) * V;
    const int64_t b = tok / t_n, t = tok - b * t_n;
    const F pos = static_cast<F>(positions[b * pb + t * pt]);
    F c[V], s[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const F inv = table ? inv_freq[i0 + j] : rope_inv_freq<F>(i0 + j, d, theta, scaling);
      sincos_of(pos * inv, &s[j], &c[j]);
      if (inverse) s[j] = -s[j];
    }
    // Where this item's first element lies in a head (the pair's halves at +0
    // and +half for RotateHalf, one run of 2V elements for Interleaved).
    const int64_t at = kInterleaved ? 2 * i0 : i0;
    const int64_t other = kInterleaved ? V : half;  // the second pack, from the first
    const T* xr = x + b * sb + t * st + at;
    T* yr = out + b * out_sb + t * out_st + at;
    for (int64_t h0 = 0; h0 < h_n; h0 += kHeadBatch) {
      Pack<T, V> lo[kHeadBatch], hi[kHeadBatch];
#pragma unroll
      for (int k = 0; k < kHeadBatch; ++k) {
        if (h0 + k < h_n) {
          lo[k] = load_pack<V>(xr + (h0 + k) * sh, 0);
          hi[k] = load_pack<V>(xr + (h0 + k) * sh + other, 0);
        }
      }
#pragma unroll
      for (int k = 0; k < kHeadBatch; ++k) {
        if (h0 + k >= h_n) break;
        Pack<T, V> ylo, yhi;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          // Pair j: (a, b) = (lo[j], hi[j]) for RotateHalf; elements 2j, 2j + 1 of the
          // 2V-element run lo ++ hi for Interleaved.
          T ea, eb;
          if constexpr (kInterleaved) {
            ea = 2 * j < V ? lo[k].v[2 * j] : hi[k].v[2 * j - V];
            eb = 2 * j + 1 < V ? lo[k].v[2 * j + 1] : hi[k].v[2 * j + 1 - V];
          } else {
            ea = lo[k].v[j];
            eb = hi[k].v[j];
          }
          const F a = cu::convert<F>(ea), bv = cu::convert<F>(eb);
          const T ya = cu::convert<T>(a * c[j] - bv * s[j]);
          const T yb = cu::convert<T>(bv * c[j] + a * s[j]);
          if constexpr (kInterleaved) {
            (2 * j < V ? ylo.v[2 * j] : yhi.v[2 * j - V]) = ya;
            (2 * j + 1 < V ? ylo.v[2 * j + 1] : yhi.v[2 * j + 1 - V]) = yb;
          } else {
            ylo.v[j] = ya;
            yhi.v[j] = yb;
          }
        }
        store_pack<V>(yr + (h0 + k) * out_sh, 0, ylo);
        store_pack<V>(yr + (h0 + k) * out_sh + other, 0, yhi);
      }
    }
  }
}

bool aligned_16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void rope(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
          const RopeScaling& scaling, bool inverse, const Tensor& out) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const int64_t b_n = x.size(0), t_n = x.size(1), h_n = x.size(2), d = x.size(3);
  const int64_t tokens = b_n * t_n;
  if (tokens == 0 || h_n == 0) return;
  cudaStream_t stream = cu::stream_for(dev);
  cu::visit_float_dtype(x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const int64_t half = d / 2;
    const bool vectorized =
        half % kVec == 0 && x.stride(0) % kVec == 0 && x.stride(1) % kVec == 0 &&
        x.stride(2) % kVec == 0 && aligned_16(x.data_ptr()) && aligned_16(out.data_ptr()) &&
        out.stride(0) % kVec == 0 && out.stride(1) % kVec == 0 && out.stride(2) % kVec == 0;
    auto launch = [&](auto vec, auto interleaved) {
      constexpr int V = decltype(vec)::value;
      constexpr bool I = decltype(interleaved)::value;
      const unsigned grid = cu::grid_for(tokens * (half / V), kRopeThreads);
      rope_kernel<T, V, I><<<grid, kRopeThreads, 0, stream>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const int64_t*>(positions.data_ptr()),
          tokens, t_n, h_n, d, x.stride(0), x.stride(1), x.stride(2), positions.stride(0),
          positions.stride(1), theta, scaling, inverse, static_cast<T*>(out.data_ptr()),
          out.stride(0), out.stride(1), out.stride(2));
      ACCRUE_LAUNCH_CHECK();
    };
    auto with_style = [&](auto vec) {
      if (style == RopeStyle::Interleaved) {
        launch(vec, std::true_type{});
      } else {
        launch(vec, std::false_type{});
      }
    };
    if (vectorized) {
      with_style(std::integral_constant<int, kVec>{});
    } else {
      with_style(std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace accrue::kernels::cuda
