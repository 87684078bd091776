// CUDA transformer fusions: the bias + GELU fallback epilogue (the cuBLASLt
// one is in kernels/cuda/gemm_epilogue.cu, Note [GELU epilogue]), the residual add
// fused with LayerNorm, and SwiGLU. RMSNorm is in kernels/cuda/rms_norm.cu, the
// rotary embedding in kernels/cuda/rope.cu.
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/elementwise_ops.cuh"
#include "accrue/kernels/fused_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

constexpr int kThreads = 256;

// ---- bias + GELU ----------------------------------------------------------------------

// pre = acc + bias and out = gelu(acc + bias) over [rows, cols], in the math
// type M, GELU taken before rounding. acc may be pre itself (f32, f64): each
// element is read before the same thread writes it, hence no __restrict__.
template <class A, class T>
__global__ void bias_gelu_kernel(const A* acc, const T* __restrict__ bias, int64_t total,
                                 int64_t cols, T* pre, T* __restrict__ out) {
  using M = cu::math_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const M v = cu::convert<M>(acc[i]) + cu::convert<M>(bias[i % cols]);
    pre[i] = cu::convert<T>(v);
    out[i] = cu::convert<T>(unary_math<UnaryOp::Gelu>(v, M(0)));
  }
}

// ---- residual + layer norm -------------------------------------------------------------

using namespace reduce;  // warp_sum, block_sum

// Note [Residual LayerNorm kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One block per row, packs of V elements (16 bytes when the row size and every
// row pointer allow it, else V = 1). Pass 1 writes sum = x + residual rounded
// to T and adds up the rounded values; passes 2 (the biased variance around
// the mean) and 3 (normalize, scale, shift) re-read the sums this same thread
// wrote, so no barrier is needed and the statistics are those of the stored
// sum, as layer_norm(binary(Add)) computes them. The re-reads of a row just
// written hit the cache; any row size works, with no shared-memory limit.
template <class T, class P, int V>
__global__ void residual_layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                                           const P* __restrict__ weight, const P* __restrict__ bias,
                                           int64_t d, cu::math_t<T> eps, T* sum,
                                           T* __restrict__ out, cu::math_t<T>* __restrict__ mean,
                                           cu::math_t<T>* __restrict__ rstd) {
  using M = cu::math_t<T>;
  __shared__ M scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t packs = d / V;
  const T* xr = x + row * d;
  const T* rr = residual + row * d;
  T* sr = sum + row * d;
  T* yr = out + row * d;

  M s = 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const Pack<T, V> a = load_pack<V>(xr, k), b = load_pack<V>(rr, k);
    Pack<T, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      c.v[j] = cu::convert<T>(cu::convert<M>(a.v[j]) + cu::convert<M>(b.v[j]));
      s += cu::convert<M>(c.v[j]);
    }
    store_pack<V>(sr, k, c);
  }
  const M mu = block_sum(s, scratch) / static_cast<M>(d);

  M v = 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const Pack<T, V> c = load_pack<V>(sr, k);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M z = cu::convert<M>(c.v[j]) - mu;
      v += z * z;
    }
  }
  const M var = block_sum(v, scratch) / static_cast<M>(d);
  const M rs = M(1) / sqrt_of(var + eps);

  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const Pack<T, V> c = load_pack<V>(sr, k);
    Pack<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t col = k * V + j;
      M value = (cu::convert<M>(c.v[j]) - mu) * rs;
      if (weight) value *= cu::convert<M>(weight[col]);
      if (bias) value += cu::convert<M>(bias[col]);
      y.v[j] = cu::convert<T>(value);
    }
    store_pack<V>(yr, k, y);
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Threads for one row of `packs` packs: about two packs per thread, a whole
// number of warps, between one warp and 512 threads.
int row_threads(int64_t packs) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{2} < packs)
    threads *= 2;
  return threads;
}

bool aligned_16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// t itself when undefined or already of dtype d, else a converted copy (on
// the device: no host synchronization).
Tensor as_dtype(const Tensor& t, DType d) {
  if (!t.defined() || t.dtype() == d) return t;
  return t.to(d);
}

template <class P>
const P* optional_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.data_ptr()) : nullptr;
}

// ---- SwiGLU ----------------------------------------------------------------------------

__device__ __forceinline__ float sigmoid_of(float g) {
  return 1.0f / (1.0f + expf(-g));
}
__device__ __forceinline__ double sigmoid_of(double g) {
  return 1.0 / (1.0 + exp(-g));
}

// A [rows, F] operand: its pointer and row stride, in elements.
template <class T>
struct Rows {
  T* p;
  int64_t stride;
};

// Pack k of row r of a [rows, F] operand; with kFlat every operand is dense
// and r is 0 (k runs over the whole tensor).
template <int V, bool kFlat, class T>
__device__ __forceinline__ T* pack_base(Rows<T> a, int64_t r) {
  return kFlat ? a.p : a.p + r * a.stride;
}

// Note [SwiGLU kernels]
// ~~~~~~~~~~~~~~~~~~~~~
// Elementwise over [rows, F] operands with their own row strides (a packed
// [.., 2F] gate-and-up tensor is read and its gradient written in place), in
// packs of V elements (16 bytes where F, the strides and the pointers allow
// it), grid-striding over the packs. Dense operands (kFlat) index the packs
// directly, without the division by the packs per row.
template <class T, int V, bool kFlat>
__global__ void swiglu_kernel(Rows<const T> gate, Rows<const T> up, Rows<T> out, int64_t total,
                              int64_t per_row) {
  using M = cu::math_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = kFlat ? 0 : i / per_row, k = kFlat ? i : i % per_row;
    const Pack<T, V> g = load_pack<V>(pack_base<V, kFlat>(gate, r), k);
    const Pack<T, V> u = load_pack<V>(pack_base<V, kFlat>(up, r), k);
    Pack<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M gv = cu::convert<M>(g.v[j]);
      y.v[j] = cu::convert<T>(gv * sigmoid_of(gv) * cu::convert<M>(u.v[j]));
    }
    store_pack<V>(pack_base<V, kFlat>(out, r), k, y);
  }
}

// dgate = dy * up * silu'(gate) with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g);
// dup = dy * silu(gate).
template <class T, int V, bool kFlat>
__global__ void swiglu_backward_kernel(Rows<const T> grad, Rows<const T> gate, Rows<const T> up,
                                       Rows<T> dgate, Rows<T> dup, int64_t total, int64_t per_row) {
  using M = cu::math_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = kFlat ? 0 : i / per_row, k = kFlat ? i : i % per_row;
    const Pack<T, V> dy = load_pack<V>(pack_base<V, kFlat>(grad, r), k);
    const Pack<T, V> g = load_pack<V>(pack_base<V, kFlat>(gate, r), k);
    const Pack<T, V> u = load_pack<V>(pack_base<V, kFlat>(up, r), k);
    Pack<T, V> dg, du;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M gv = cu::convert<M>(g.v[j]), uv = cu::convert<M>(u.v[j]);
      const M dyv = cu::convert<M>(dy.v[j]);
      const M s = sigmoid_of(gv);
      dg.v[j] = cu::convert<T>(dyv * uv * (s * (M(1) + gv * (M(1) - s))));
      du.v[j] = cu::convert<T>(dyv * gv * s);
    }
    store_pack<V>(pack_base<V, kFlat>(dgate, r), k, dg);
    store_pack<V>(pack_base<V, kFlat>(dup, r), k, du);
  }
}

template <class T>
Rows<T> rows_of(const Tensor& t) {
  return Rows<T>{static_cast<T*>(t.data_ptr()), t.stride(0)};
}

// Launches f(V, kFlat, grid, total, per_row) for the [rows, F] operands ts.
template <class T, class F>
void launch_swiglu(std::initializer_list<const Tensor*> ts, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t rows = (*ts.begin())->size(0), cols = (*ts.begin())->size(1);
  bool vectorized = cols % kVec == 0, flat = true;
  for (const Tensor* t : ts) {
    vectorized = vectorized && t->stride(0) % kVec == 0 && aligned_16(*t);
    flat = flat && (rows == 1 || t->stride(0) == cols);
  }
  auto go = [&](auto vec, auto flat_tag) {
    constexpr int V = decltype(vec)::value;
    const int64_t per_row = cols / V, total = rows * per_row;
    f(vec, flat_tag, cu::grid_for(total, kThreads), total, per_row);
  };
  auto with_flat = [&](auto vec) {
    if (flat) {
      go(vec, std::true_type{});
    } else {
      go(vec, std::false_type{});
    }
  };
  if (vectorized) {
    with_flat(std::integral_constant<int, kVec>{});
  } else {
    with_flat(std::integral_constant<int, 1>{});
  }
}

}  // namespace

void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  cu::visit_float_dtype(out.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch_swiglu<T>({&gate, &up, &out}, [&](auto vec, auto flat, unsigned grid, int64_t total,
                                             int64_t per_row) {
      constexpr int V = decltype(vec)::value;
      constexpr bool kFlat = decltype(flat)::value;
      swiglu_kernel<T, V, kFlat><<<grid, kThreads, 0, stream>>>(
          rows_of<const T>(gate), rows_of<const T>(up), rows_of<T>(out), total, per_row);
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  const int dev = gate.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  cu::visit_float_dtype(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_swiglu<T>({&grad, &gate, &up, &dgate, &dup},
                     [&](auto vec, auto flat, unsigned grid, int64_t total, int64_t per_row) {
                       constexpr int V = decltype(vec)::value;
                       constexpr bool kFlat = decltype(flat)::value;
                       swiglu_backward_kernel<T, V, kFlat><<<grid, kThreads, 0, stream>>>(
                           rows_of<const T>(grad), rows_of<const T>(gate), rows_of<const T>(up),
                           rows_of<T>(dgate), rows_of<T>(dup), total, per_row);
                       ACCRUE_LAUNCH_CHECK();
                     });
  });
}

void bias_gelu(const Tensor& acc, const Tensor& bias, const Tensor& pre, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t total = out.numel(), cols = out.size(1);
  if (total == 0) return;
  cu::visit_float_dtype(out.dtype(), "linear_gelu", [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    ACCRUE_CHECK(acc.dtype() == (std::is_same_v<A, double> ? DType::f64 : DType::f32),
                 "linear_gelu: accumulator of dtype ", dtype_name(acc.dtype()), " for output ",
                 dtype_name(out.dtype()));
    bias_gelu_kernel<A, T><<<cu::grid_for(total, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
        static_cast<const A*>(acc.data_ptr()), static_cast<const T*>(bias.data_ptr()), total, cols,
        static_cast<T*>(pre.data_ptr()), static_cast<T*>(out.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
}

void residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight_in,
                         const Tensor& bias_in, double eps, const Tensor& sum, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = x.size(0), d = x.size(1);
  if (rows == 0) return;
  ACCRUE_CHECK(rows <= std::numeric_limits<int32_t>::max(), "residual_layer_norm: ", rows,
               " rows exceed the CUDA grid limit");
  // Parameters in one dtype: f32 when either is an fp32 master weight, else x's.
  const bool f32_params = (weight_in.defined() && weight_in.dtype() == DType::f32) ||
                          (bias_in.defined() && bias_in.dtype() == DType::f32);
  const DType param_dtype = f32_params ? DType::f32 : x.dtype();
  const Tensor weight = as_dtype(weight_in, param_dtype);
  const Tensor bias = as_dtype(bias_in, param_dtype);
  cudaStream_t stream = cu::stream_for(dev);
  cu::visit_float_dtype(x.dtype(), "residual_layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using M = cu::math_t<T>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vectorized = d % kVec == 0 && aligned_16(x) && aligned_16(residual) &&
                            aligned_16(sum) && aligned_16(out);
    auto launch = [&](auto param_tag, auto vec) {
      using P = decltype(param_tag);
      constexpr int V = decltype(vec)::value;
      residual_layer_norm_kernel<T, P, V>
          <<<static_cast<unsigned>(rows), row_threads(d / V), 0, stream>>>(
              static_cast<const T*>(x.data_ptr()), static_cast<const T*>(residual.data_ptr()),
              optional_ptr<P>(weight), optional_ptr<P>(bias), d, static_cast<M>(eps),
              static_cast<T*>(sum.data_ptr()), static_cast<T*>(out.data_ptr()),
              static_cast<M*>(mean.data_ptr()), static_cast<M*>(rstd.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    };
    auto with_params = [&](auto vec) {
      if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
        if (f32_params) return launch(float{}, vec);
      }
      return launch(T{}, vec);
    };
    if (vectorized) {
      with_params(std::integral_constant<int, kVec>{});
    } else {
      with_params(std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace accrue::kernels::cuda
