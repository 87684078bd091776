// CUDA softmax / log_softmax over the last dim and their backward: one online
// pass for the row's maximum and sum, then one pass that writes, in the order
// of Note [Fixed reduction order] (kernels/cuda/row_reduce.cuh).
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/row_reduce.cuh"

namespace accrue::kernels::cuda {
namespace {

// Online softmax state: the running maximum and the sum of exp(x - max).
template <class M>
struct SoftmaxAcc {
  M max;
  M sum;
};

template <class M>
__device__ __forceinline__ SoftmaxAcc<M> shfl_xor(SoftmaxAcc<M> a, int m) {
  return {shfl_xor(a.max, m), shfl_xor(a.sum, m)};
}

// ---- reducers: what softmax folds ----------------------------------------------------------

// Fold x into the online softmax state. -inf entries (masks) add nothing; a
// NaN poisons the sum.
template <class T>
struct SoftmaxReducer {
  using M = dev::math_t<T>;
  using A = SoftmaxAcc<M>;
  __device__ static A identity() { return {negative_infinity<M>(), M(0)}; }
  __device__ static A step(A acc, int64_t, T x) {
    const M v = dev::convert<M>(x);
    if (v > acc.max) {
      acc.sum = acc.sum * exp_of(acc.max - v) + M(1);
      acc.max = v;
    } else if (acc.max != negative_infinity<M>() || v != v) {
      acc.sum += exp_of(v - acc.max);
    }
    return acc;
  }
  // A part with sum 0 has seen nothing but -inf and contributes nothing (its
  // max may be -inf, where exp(max - m) would be NaN).
  __device__ static M rescaled(const A& a, M m) {
    return a.sum == M(0) ? M(0) : a.sum * exp_of(a.max - m);
  }
  __device__ static A combine(A a, A b) {
    const M m = b.max > a.max ? b.max : a.max;
    return {m, rescaled(a, m) + rescaled(b, m)};
  }
};

// sum(dy * y) for softmax, sum(dy) for log_softmax.
template <class T, bool kLog>
struct SoftmaxGradReducer {
  using M = dev::math_t<T>;
  using A = M;
  __device__ static A identity() { return A(0); }
  __device__ static A step(A acc, int64_t, T g, T y) {
    const M mg = dev::convert<M>(g);
    return acc + (kLog ? mg : mg * dev::convert<M>(y));
  }
  __device__ static A combine(A a, A b) { return a + b; }
};

// out[e] = f(in[e]...) for this thread's share of a segment of `count` elements.
template <int V, class F, class Out, class... In>
__device__ __forceinline__ void map_segment(const F& f, int64_t count, int t, int nthreads,
                                            Out* out, const In*... in) {
  const int64_t packs = count / V;
  if (pack_aligned<V>(out) && (pack_aligned<V>(in) && ...)) {
    for (int64_t c = t; c < packs; c += nthreads)
      store_pack<V>(out, c, apply_pack<V, F, Out>(f, load_pack<V>(in, c)...));
  } else {
    for (int64_t c = t; c < packs; c += nthreads)
#pragma unroll
      for (int j = 0; j < V; ++j)
        out[c * V + j] = f(in[c * V + j]...);
  }
  if (t == packs % nthreads)
    for (int64_t e = packs * V; e < count; ++e)
      out[e] = f(in[e]...);
}

// ---- softmax ---------------------------------------------------------------------------------

// softmax: out = exp(x - max) * (1 / sum) (one division per row, not per element);
// log_softmax: out = x - max - log(sum).
template <class M>
struct SoftmaxWrite {
  M max;
  M inv_sum;
  M log_sum;
  bool log;
  template <class T>
  __device__ __forceinline__ T operator()(T x) const {
    const M d = dev::convert<M>(x) - max;
    return dev::convert<T>(log ? d - log_sum : exp_of(d) * inv_sum);
  }
};

template <class T, int V, bool kWarp>
__global__ void __launch_bounds__(kThreads)
    softmax_kernel(const T* in, T* out, int64_t rows, int64_t cols, bool log) {
  using R = SoftmaxReducer<T>;
  using M = dev::math_t<T>;
  __shared__ typename R::A smem[kWarps];
  const RowGroup<kWarp> g;
  if (kWarp && g.row >= rows) return;
  const T* x = in + g.row * cols;
  typename R::A acc = fold_segment<R, V>(R::identity(), 0, cols, g.t, g.nthreads, x);
  acc = group_allreduce<R, kWarp>(acc, smem);
  const SoftmaxWrite<M> w{acc.max, M(1) / acc.sum, log_of(acc.sum), log};
  map_segment<V>(w, cols, g.t, g.nthreads, out + g.row * cols, x);
}

// dx = y * (dy - sum(dy * y)) for softmax; dx = dy - exp(y) * sum(dy) for log_softmax.
template <class M, bool kLog>
struct SoftmaxGradWrite {
  M s;
  template <class T>
  __device__ __forceinline__ T operator()(T g, T y) const {
    const M mg = dev::convert<M>(g), my = dev::convert<M>(y);
    return dev::convert<T>(kLog ? mg - exp_of(my) * s : my * (mg - s));
  }
};

template <class T, int V, bool kWarp, bool kLog>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(const T* grad, const T* output, T* grad_in, int64_t rows,
                            int64_t cols) {
  using R = SoftmaxGradReducer<T, kLog>;
  __shared__ typename R::A smem[kWarps];
  const RowGroup<kWarp> g;
  if (kWarp && g.row >= rows) return;
  const int64_t base = g.row * cols;
  typename R::A s =
      fold_segment<R, V>(R::identity(), 0, cols, g.t, g.nthreads, grad + base, output + base);
  s = group_allreduce<R, kWarp>(s, smem);
  map_segment<V>(SoftmaxGradWrite<dev::math_t<T>, kLog>{s}, cols, g.t, g.nthreads, grad_in + base,
                 grad + base, output + base);
}

// Rows and columns of a contiguous [..., cols] tensor.
struct RowsCols {
  int64_t rows;
  int64_t cols;
};
RowsCols rows_cols(const Tensor& t) {
  const int64_t cols = t.dim() == 0 ? 1 : t.shape().back();
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

// Launches a row kernel with one warp per row for short rows, else one block per row.
template <class WarpKernel, class BlockKernel, class... Args>
void launch_rows(WarpKernel warp_kernel, BlockKernel block_kernel, RowsCols rc, int device,
                 const char* op, Args... args) {
  cudaStream_t stream = dev::stream_for(device);
  if (rc.cols <= kWarpRowMaxCols) {
    warp_kernel<<<checked_grid((rc.rows + kWarps - 1) / kWarps, op), kThreads, 0, stream>>>(
        args...);
  } else {
    block_kernel<<<checked_grid(rc.rows, op), kThreads, 0, stream>>>(args...);
  }
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

void softmax(const Tensor& in, const Tensor& out, bool log) {
  const RowsCols rc = rows_cols(in);
  if (rc.rows == 0) return;
  const int device = in.device().index;
  dev::DeviceScope scope(device);
  const char* name = log ? "log_softmax" : "softmax";
  dev::visit_float_dtype(in.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    launch_rows(softmax_kernel<T, V, true>, softmax_kernel<T, V, false>, rc, device, name,
                static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), rc.rows,
                rc.cols, log);
  });
}

void softmax_backward(const Tensor& grad, const Tensor& output, const Tensor& grad_in, bool log) {
  const RowsCols rc = rows_cols(grad);
  if (rc.rows == 0) return;
  const int device = grad.device().index;
  dev::DeviceScope scope(device);
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  dev::visit_float_dtype(grad.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* g = static_cast<const T*>(grad.data_ptr());
    const T* y = static_cast<const T*>(output.data_ptr());
    T* dx = static_cast<T*>(grad_in.data_ptr());
    if (log) {
      launch_rows(softmax_backward_kernel<T, V, true, true>,
                  softmax_backward_kernel<T, V, false, true>, rc, device, name, g, y, dx, rc.rows,
                  rc.cols);
    } else {
      launch_rows(softmax_backward_kernel<T, V, true, false>,
                  softmax_backward_kernel<T, V, false, false>, rc, device, name, g, y, dx, rc.rows,
                  rc.cols);
    }
  });
}

}  // namespace accrue::kernels::cuda
