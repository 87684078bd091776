// CUDA max pooling (Note [Max pooling kernels], kernels/conv_backend.h).
#include <cstdint>
#include <initializer_list>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/core/device_scope.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr int kThreads = 256;

// Element strides of a 4-D [N, C, H, W] tensor.
struct Strides4 {
  int64_t n, c, h, w;
  __device__ int64_t at(int64_t in, int64_t ic, int64_t ih, int64_t iw) const {
    return in * n + ic * c + ih * h + iw * w;
  }
};

Strides4 strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

struct PoolShape {
  int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  bool channels_last;  // the order of the threads: N, H, W, C (else N, C, H, W)
};

PoolShape pool_shape(const Conv2dGeometry& g, bool channels_last) {
  const Conv2dOptions& o = g.options;
  return {g.n,        g.c,        g.h,     g.w,     g.oh,         g.ow,         g.kh,         g.kw,
          o.stride_h, o.stride_w, o.pad_h, o.pad_w, o.dilation_h, o.dilation_w, channels_last};
}

// Element e of a [N, C, P, Q] iteration in the thread order of `s`.
__device__ void unravel(int64_t e, int64_t p, int64_t q, const PoolShape& s, int64_t& in,
                        int64_t& ic, int64_t& ip, int64_t& iq) {
  if (s.channels_last) {
    ic = e % s.c;
    e /= s.c;
    iq = e % q;
    e /= q;
    ip = e % p;
    in = e / p;
  } else {
    iq = e % q;
    e /= q;
    ip = e % p;
    e /= p;
    ic = e % s.c;
    in = e / s.c;
  }
}

// Whether v replaces best (best_at < 0: nothing kept yet) under the CPU
// reference's rule: the first maximum wins, and a NaN wins and stays.
template <class A>
__device__ __forceinline__ bool replaces(A v, A best, int64_t best_at) {
  return best_at < 0 || (!isnan(best) && (v > best || isnan(v)));
}

// The outputs [i0, i1] x [j0, j1] whose windows can hold input (h, w): those
// with i sh - ph + a dh = h (j likewise) for some tap a.
struct Sources {
  int64_t i0, i1, j0, j1;
};

__device__ __forceinline__ int64_t first_output(int64_t lo, int64_t stride) {
  return lo <= 0 ? 0 : (lo + stride - 1) / stride;  // lo may be negative
}

__device__ __forceinline__ Sources sources_of(int64_t h, int64_t w, const PoolShape& s) {
  return {first_output(h + s.ph - (s.kh - 1) * s.dh, s.sh), min(s.oh - 1, (h + s.ph) / s.sh),
          first_output(w + s.pw - (s.kw - 1) * s.dw, s.sw), min(s.ow - 1, (w + s.pw) / s.sw)};
}

template <class T>
__global__ void max_pool_kernel(const T* __restrict__ x, Strides4 xs, PoolShape s,
                                T* __restrict__ out, Strides4 os, int64_t* __restrict__ indices,
                                Strides4 is, int64_t total) {
  using A = cu::math_t<T>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t in, ic, i, j;
    unravel(e, s.oh, s.ow, s, in, ic, i, j);
    const T* plane = x + in * xs.n + ic * xs.c;
    A best = 0;
    T best_value = T{};
    int64_t best_at = -1;
    for (int64_t a = 0; a < s.kh; ++a) {
      const int64_t h = i * s.sh - s.ph + a * s.dh;
      if (h < 0 || h >= s.h) continue;
      for (int64_t b = 0; b < s.kw; ++b) {
        const int64_t w = j * s.sw - s.pw + b * s.dw;
        if (w < 0 || w >= s.w) continue;
        const T value = plane[h * xs.h + w * xs.w];
        const A v = reduce::load<A>(value);
        if (replaces(v, best, best_at)) {
          best = v;
          best_value = value;
          best_at = h * s.w + w;
        }
      }
    }
    out[os.at(in, ic, i, j)] = best_at < 0 ? cu::convert<T>(-INFINITY) : best_value;
    indices[is.at(in, ic, i, j)] = best_at;
  }
}

template <class T>
__global__ void max_pool_backward_kernel(const T* __restrict__ grad, Strides4 gs,
                                         const int64_t* __restrict__ indices, Strides4 is,
                                         PoolShape s, T* __restrict__ dx, Strides4 ds,
                                         int64_t total) {
  using A = cu::math_t<T>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t in, ic, h, w;
    unravel(e, s.h, s.w, s, in, ic, h, w);
    const Sources r = sources_of(h, w, s);
    const int64_t position = h * s.w + w;
    A sum = 0;
    for (int64_t i = r.i0; i <= r.i1; ++i)
      for (int64_t j = r.j0; j <= r.j1; ++j)
        if (indices[is.at(in, ic, i, j)] == position)
          sum += reduce::load<A>(grad[gs.at(in, ic, i, j)]);
    dx[ds.at(in, ic, h, w)] = cu::convert<T>(sum);
  }
}

// The packed channels-last kernels: one thread per V consecutive channels of
// one pixel (a 16-byte pack), every operand packed channels-last, C % V == 0.
// Same rule and order per channel as the kernels above, with an eighth of
// their threads' index arithmetic for bf16 and 16-byte loads and stores.
template <class T, int V>
__global__ void max_pool_packed_kernel(const T* __restrict__ x, PoolShape s, T* __restrict__ out,
                                       int64_t* __restrict__ indices, int64_t total) {
  using A = cu::math_t<T>;
  const int64_t packs = s.c / V;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = e % packs, j = e / packs % s.ow, i = e / packs / s.ow % s.oh,
                  n = e / packs / s.ow / s.oh;
    A best[V] = {};  // replaces() reads it before best_at is set
    cu::Pack<T, V> best_value;
    int64_t best_at[V];
#pragma unroll
    for (int v = 0; v < V; ++v)
      best_at[v] = -1;
    for (int64_t a = 0; a < s.kh; ++a) {
      const int64_t h = i * s.sh - s.ph + a * s.dh;
      if (h < 0 || h >= s.h) continue;
      for (int64_t b = 0; b < s.kw; ++b) {
        const int64_t w = j * s.sw - s.pw + b * s.dw;
        if (w < 0 || w >= s.w) continue;
        const cu::Pack<T, V> pack = cu::load_pack<V>(x, ((n * s.h + h) * s.w + w) * packs + p);
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const A value = reduce::load<A>(pack.v[v]);
          if (replaces(value, best[v], best_at[v])) {
            best[v] = value;
            best_value.v[v] = pack.v[v];
            best_at[v] = h * s.w + w;
          }
        }
      }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (best_at[v] < 0) best_value.v[v] = cu::convert<T>(-INFINITY);
      indices[e * V + v] = best_at[v];
    }
    cu::store_pack<V>(out, e, best_value);
  }
}

template <class T, int V>
__global__ void max_pool_backward_packed_kernel(const T* __restrict__ grad,
                                                const int64_t* __restrict__ indices, PoolShape s,
                                                T* __restrict__ dx, int64_t total) {
  using A = cu::math_t<T>;
  const int64_t packs = s.c / V;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = e % packs, w = e / packs % s.w, h = e / packs / s.w % s.h,
                  n = e / packs / s.w / s.h;
    const Sources r = sources_of(h, w, s);
    const int64_t position = h * s.w + w;
    A sum[V] = {};
    for (int64_t i = r.i0; i <= r.i1; ++i)
      for (int64_t j = r.j0; j <= r.j1; ++j) {
        const int64_t at = ((n * s.oh + i) * s.ow + j) * packs + p;
        const cu::Pack<T, V> g = cu::load_pack<V>(grad, at);
#pragma unroll
        for (int v = 0; v < V; ++v)
          if (indices[at * V + v] == position) sum[v] += reduce::load<A>(g.v[v]);
      }
    cu::Pack<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v)
      out.v[v] = cu::convert<T>(sum[v]);
    cu::store_pack<V>(dx, e, out);
  }
}

// Whether every tensor is packed channels-last with whole 16-byte packs of channels.
template <class T>
bool packed_channels_last(std::initializer_list<const Tensor*> tensors) {
  constexpr int V = 16 / sizeof(T);
  for (const Tensor* t : tensors)
    if (!dispatch_util::channels_last(*t) || t->size(1) % V != 0 ||
        reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      return false;
  return true;
}

}  // namespace

void max_pool2d(const Tensor& x, const Tensor& out, const Tensor& indices,
                const Conv2dGeometry& g) {
  // The threads run in out's memory order (Note [Max pooling kernels]).
  const bool channels_last = dispatch_util::channels_last(out);
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const int64_t total = g.n * g.c * g.oh * g.ow;
  cu::visit_float_dtype(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (packed_channels_last<T>({&x, &out, &indices})) {
      max_pool_packed_kernel<T, V>
          <<<cu::grid_for(total / V, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const T*>(x.data_ptr()), pool_shape(g, true),
              static_cast<T*>(out.data_ptr()), static_cast<int64_t*>(indices.data_ptr()),
              total / V);
      ACCRUE_LAUNCH_CHECK();
      return;
    }
    max_pool_kernel<T><<<cu::grid_for(total, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
        static_cast<const T*>(x.data_ptr()), strides_of(x), pool_shape(g, channels_last),
        static_cast<T*>(out.data_ptr()), strides_of(out), static_cast<int64_t*>(indices.data_ptr()),
        strides_of(indices), total);
    ACCRUE_LAUNCH_CHECK();
  });
}

void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx,
                         const Conv2dGeometry& g) {
  // The threads run in dx's memory order (Note [Max pooling kernels]).
  const bool channels_last = dispatch_util::channels_last(dx);
  const int dev = grad.device().index;
  cu::DeviceScope scope(dev);
  const int64_t total = g.n * g.c * g.h * g.w;
  cu::visit_float_dtype(grad.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (packed_channels_last<T>({&grad, &indices, &dx})) {
      max_pool_backward_packed_kernel<T, V>
          <<<cu::grid_for(total / V, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const T*>(grad.data_ptr()),
              static_cast<const int64_t*>(indices.data_ptr()), pool_shape(g, true),
              static_cast<T*>(dx.data_ptr()), total / V);
      ACCRUE_LAUNCH_CHECK();
      return;
    }
    max_pool_backward_kernel<T>
        <<<cu::grid_for(total, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
            static_cast<const T*>(grad.data_ptr()), strides_of(grad),
            static_cast<const int64_t*>(indices.data_ptr()), strides_of(indices),
            pool_shape(g, channels_last), static_cast<T*>(dx.data_ptr()), strides_of(dx), total);
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::kernels::cuda
