// CUDA rotary position embedding (Note [Rotary embedding], kernels/fused.h),
// forward and backward (the rotation by -angle).
#include <algorithm>
#include <cstdint>
#include <limits>
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
// Frequencies held in shared memory at once.
constexpr int kRopeChunk = 256;

__device__ __forceinline__ void sincos_of(float a, float* s, float* c) {
  sincosf(a, s, c);
}
__device__ __forceinline__ void sincos_of(double a, double* s, double* c) {
  sincos(a, s, c);
}

// Note [Rotary kernel]
// ~~~~~~~~~~~~~~~~~~~~
// A block takes `pass` tokens (b, t) at a time, grid-striding over them: it
// computes cos and sin of those tokens' angles for up to kRopeChunk pairs
// into shared memory (inv_freq once per block when one chunk holds every
// pair, since it does not depend on the token), then rotates every head's
// pairs with them. A work item is V pairs: V-element packs at i and i + D/2
// (RotateHalf), or the 2V elements from 2i (Interleaved); 16-byte packs where
// D/2, the strides and the pointers allow it, else V = 1. pass is 1 when a
// token's items fill the block (32 heads of 128: 256 items for 128 threads;
// four tokens a pass measured slower there, 0.117 ms against 0.109 on an
// H200), and up to kMaxPass tokens when they do not, so small heads keep the
// threads busy (llama-125m's 12 query heads of 64 are 48 items a token, its 4
// key heads 16: one token a block ran at 0.3 of the copy rate, 40 us a call
// under ncu on an H200). The tables then hold pass x D/2 <= kRopeChunk
// entries. x is read through its strides (a view of a packed qkv), out
// through its own (x itself for the in-place rope_): a thread reads each
// element before it writes it, and no other thread touches it, hence no
// __restrict__ on either. The pass's tokens are split into (b, t) once, into
// shared memory (their position and row offsets), and the work items are
// numbered in 32 bits: a 64-bit division is a software routine of dozens of
// instructions, and each 16-byte item paid six. The launch checks that a
// pass's items fit 32 bits.
constexpr int64_t kMaxPass = 8;

// Tokens per block pass (Note [Rotary kernel]): enough for the block's
// threads, within the tables.
int64_t tokens_per_pass(int64_t half, int64_t heads, int v) {
  if (half > kRopeChunk) return 1;
  const int64_t items = heads * std::max<int64_t>(1, half / v);
  const int64_t wanted = (kRopeThreads + items - 1) / items;
  return std::max<int64_t>(1, std::min({wanted, kMaxPass, kRopeChunk / half}));
}

template <class T, int V, bool kInterleaved>
__global__ void rope_kernel(const T* x, const int64_t* __restrict__ positions, int64_t tokens,
                            int pass, int64_t t_n, int h_n, int64_t d, int64_t sb, int64_t st,
                            int64_t sh, int64_t pb, int64_t pt, double theta, RopeScaling scaling,
                            bool inverse, T* out, int64_t out_sb, int64_t out_st, int64_t out_sh) {
  using F = cu::math_t<T>;
  __shared__ F inv_freq[kRopeChunk];
  __shared__ F cs[kRopeChunk];
  __shared__ F sn[kRopeChunk];
  // The pass's tokens: position, and where the token's row starts in x and out.
  __shared__ F pos[kMaxPass];
  __shared__ int64_t x_row[kMaxPass];
  __shared__ int64_t out_row[kMaxPass];
  const int64_t half = d / 2;
  const bool one_chunk = half <= kRopeChunk;
  if (one_chunk) {
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x)
      inv_freq[i] = rope_inv_freq<F>(i, d, theta, scaling);
  }
  for (int64_t tok0 = static_cast<int64_t>(blockIdx.x) * pass; tok0 < tokens;
       tok0 += static_cast<int64_t>(gridDim.x) * pass) {
    const int n = static_cast<int>(std::min<int64_t>(pass, tokens - tok0));  // tokens this pass
    __syncthreads();  // the previous pass's tokens and tables are no longer read
    if (static_cast<int>(threadIdx.x) < n) {
      const int64_t tok = tok0 + threadIdx.x, b = tok / t_n, t = tok - b * t_n;
      pos[threadIdx.x] = static_cast<F>(positions[b * pb + t * pt]);
      x_row[threadIdx.x] = b * sb + t * st;
      out_row[threadIdx.x] = b * out_sb + t * out_st;
    }
    for (int64_t c0 = 0; c0 < half; c0 += kRopeChunk) {
      const int len = static_cast<int>(std::min<int64_t>(kRopeChunk, half - c0));
      __syncthreads();  // the tokens are written; the previous chunk's tables no longer read
      for (int i = threadIdx.x; i < n * len; i += blockDim.x) {
        const int k = i / len, f = i - k * len;
        const F inv = one_chunk ? inv_freq[f] : rope_inv_freq<F>(c0 + f, d, theta, scaling);
        F s, c;
        sincos_of(pos[k] * inv, &s, &c);
        cs[i] = c;
        sn[i] = inverse ? -s : s;
      }
      __syncthreads();
      const int per_head = len / V;
      const int per_token = h_n * per_head;
      for (int it = threadIdx.x; it < n * per_token; it += blockDim.x) {
        const int k = it / per_token, rest = it - k * per_token;
        const int h = rest / per_head;
        const int j0 = (rest - h * per_head) * V;
        const int64_t i0 = c0 + j0;
        const T* xr = x + x_row[k] + h * sh;
        T* yr = out + out_row[k] + h * out_sh;
        const F* tc = cs + k * len;
        const F* ts = sn + k * len;
        F a[V], bv[V];
        if constexpr (kInterleaved) {
          const Pack<T, V> lo = load_pack<V>(xr + 2 * i0, 0), hi = load_pack<V>(xr + 2 * i0, 1);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const T ea = 2 * j < V ? lo.v[2 * j] : hi.v[2 * j - V];
            const T eb = 2 * j + 1 < V ? lo.v[2 * j + 1] : hi.v[2 * j + 1 - V];
            a[j] = cu::convert<F>(ea);
            bv[j] = cu::convert<F>(eb);
          }
        } else {
          const Pack<T, V> pa = load_pack<V>(xr + i0, 0), pbk = load_pack<V>(xr + half + i0, 0);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            a[j] = cu::convert<F>(pa.v[j]);
            bv[j] = cu::convert<F>(pbk.v[j]);
          }
        }
        T ya[V], yb[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const F c = tc[j0 + j], s = ts[j0 + j];
          ya[j] = cu::convert<T>(a[j] * c - bv[j] * s);
          yb[j] = cu::convert<T>(bv[j] * c + a[j] * s);
        }
        if constexpr (kInterleaved) {
          Pack<T, V> lo, hi;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            (2 * j < V ? lo.v[2 * j] : hi.v[2 * j - V]) = ya[j];
            (2 * j + 1 < V ? lo.v[2 * j + 1] : hi.v[2 * j + 1 - V]) = yb[j];
          }
          store_pack<V>(yr + 2 * i0, 0, lo);
          store_pack<V>(yr + 2 * i0, 1, hi);
        } else {
          Pack<T, V> pa, pbk;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            pa.v[j] = ya[j];
            pbk.v[j] = yb[j];
          }
          store_pack<V>(yr + i0, 0, pa);
          store_pack<V>(yr + half + i0, 0, pbk);
        }
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
      const int64_t pass = tokens_per_pass(half, h_n, V);
      // The kernel numbers a pass's items in 32 bits (Note [Rotary kernel]).
      const int64_t items =
          pass * h_n * std::max<int64_t>(1, std::min<int64_t>(half, kRopeChunk) / V);
      ACCRUE_CHECK(items <= std::numeric_limits<int32_t>::max(), "rope: ", h_n, " heads of ", d,
                   " exceed the kernel's 32-bit item count");
      const unsigned grid = cu::grid_for((tokens + pass - 1) / pass, 1);
      rope_kernel<T, V, I><<<grid, kRopeThreads, 0, stream>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const int64_t*>(positions.data_ptr()),
          tokens, static_cast<int>(pass), t_n, static_cast<int>(h_n), d, x.stride(0), x.stride(1),
          x.stride(2), positions.stride(0), positions.stride(1), theta, scaling, inverse,
          static_cast<T*>(out.data_ptr()), out.stride(0), out.stride(1), out.stride(2));
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
