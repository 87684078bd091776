// CUDA elementwise ops: binary, binary_scalar, unary, unary_backward,
// minmax_backward, clamp, clamp_backward, triangle, compare, where, axpy (see
// kernels/backend_functions.inc for the contracts).
//
// Every op is a functor (kernels/cuda/elementwise_ops.cuh) mapped over the
// output by one of three kernels:
//  - map_contiguous_kernel: every operand contiguous with the output's shape
//    (the common case). Each thread moves 16 bytes per operand per iteration
//    (float4, 8 x bf16, ...), then a scalar loop does the tail;
//  - map_rows_kernel: broadcast or strided views whose innermost collapsed dim
//    is contiguous in every operand, or broadcast (a splat: one value a row,
//    as a scalar operand is), in 16-byte packs (Note [Rows of packs]);
//  - map_strided_kernel: any other broadcast (0 strides) or strided views. The
//    shape is first collapsed (Note [Collapsed geometry] in
//    core/collapsed_geometry.h), then each linear index is decomposed once and
//    dotted with each operand's strides.
// The triangles (tril, triu) need each element's row and column, so they have
// a kernel of their own. Indices are 64-bit; loops are grid-stride so any size
// runs on a capped grid.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "accrue/core/collapsed_geometry.h"
#include "accrue/core/cuda_types.cuh"
#include "accrue/core/strided_index.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/elementwise_ops.cuh"

namespace accrue::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// ---- the kernels ---------------------------------------------------------------------

// out[i] = f(in[i]...) over contiguous operands. `vectorized` is false when some
// pointer is not aligned for V-wide access; then the scalar loop does everything.
// No __restrict__: axpy's output is also an input (each element is read before it
// is written, by the same thread).
template <int V, class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads)
    map_contiguous_kernel(F f, int64_t n, bool vectorized, Out* out, const In*... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = vectorized ? n / V : 0;
  for (int64_t p = tid; p < packs; p += stride) {
    store_pack<V>(out, p, apply_pack<V, F, Out>(f, load_pack<V>(in, p)...));
  }
  for (int64_t i = packs * V + tid; i < n; i += stride)
    out[i] = f(in[i]...);
}

template <class F, class Out, class... In, size_t... K>
__device__ __forceinline__ void apply_strided(const F& f, const int64_t (&off)[sizeof...(In) + 1],
                                              Out* out, std::index_sequence<K...>,
                                              const In*... in) {
  out[off[0]] = f(in[off[K + 1]]...);
}

template <class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads)
    map_strided_kernel(F f, int64_t n, CollapsedGeometry<sizeof...(In) + 1> calc, Out* out,
                       const In*... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[sizeof...(In) + 1];
    calc.offsets(i, off);
    apply_strided(f, off, out, std::index_sequence_for<In...>{}, in...);
  }
}

// Pack `col` of a row, or, for a splat operand (dim 0 stride 0), the row's one
// value in every lane (Note [Rows of packs]). `splat` is the same for every
// thread, so the branch does not diverge.
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_row_pack(const T* row, int64_t col, bool splat) {
  if (!splat) return load_pack<V>(row, col);
  Pack<T, V> p;
  const T v = row[0];
#pragma unroll
  for (int j = 0; j < V; ++j)
    p.v[j] = v;
  return p;
}

// out = f(in...) over operands whose collapsed dim 0 is contiguous in every
// one, or a splat, and a whole number of V-packs (Note [Rows of packs]); bit K
// of `splats` marks input K a splat.
template <int V, class F, class Out, class... In, size_t... K>
__device__ __forceinline__ void apply_rows(const F& f, const int64_t (&off)[sizeof...(In) + 1],
                                           int64_t col, uint32_t splats, Out* out,
                                           std::index_sequence<K...>, const In*... in) {
  store_pack<V>(out + off[0], col,
                apply_pack<V, F, Out>(
                    f, load_row_pack<V>(in + off[K + 1], col, ((splats >> K) & 1u) != 0)...));
}

template <int V, class F, class Out, class... In>
__global__ void __launch_bounds__(kThreads)
    map_rows_kernel(F f, int64_t packs, RowSplitter split,
                    CollapsedGeometry<sizeof...(In) + 1> rows, uint32_t splats, Out* out,
                    const In*... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    int64_t row, col;
    split.split(p, row, col);
    int64_t off[sizeof...(In) + 1];
    rows.offsets(row, off);
    apply_rows<V>(f, off, col, splats, out, std::index_sequence_for<In...>{}, in...);
  }
}

// ---- launching -------------------------------------------------------------------------------

// An input operand: its typed pointer and its tensor (for strides and contiguity).
template <class T>
struct Input {
  const T* ptr;
  const Tensor* tensor;
};
template <class T>
Input<T> input(const Tensor& t) {
  return {static_cast<const T*>(t.data_ptr()), &t};
}

template <class T>
constexpr int max_size_of() {
  return sizeof(T);
}
template <class T, class U, class... Rest>
constexpr int max_size_of() {
  return std::max<int>(sizeof(T), max_size_of<U, Rest...>());
}

// Whether every input that is not a splat (bit k of `splats` for input k) is
// aligned for V-packs.
template <int V, class... In>
bool inputs_aligned(uint32_t splats, const In*... ptr) {
  int k = 0;
  bool ok = true;
  ((ok = ok && (((splats >> k++) & 1u) != 0 || pack_aligned<V>(ptr))), ...);
  return ok;
}

// out[i] = fast(in[i]...) when every operand is contiguous, else slow(in[i]...)
// through the strided kernel (fast and slow compute the same thing; fast may be
// specialised on the op). `out_t` may itself be strided (axpy's destination).
template <class Fast, class Slow, class Out, class... In>
void launch_map(const Fast& fast, const Slow& slow, Out* out, const Tensor& out_t,
                Input<In>... in) {
  const int64_t n = out_t.numel();
  if (n == 0) return;
  const int device = out_t.device().index;
  dev::DeviceScope scope(device);
  cudaStream_t stream = dev::stream_for(device);

  const bool contiguous = out_t.is_contiguous() && (in.tensor->is_contiguous() && ...);
  if (contiguous) {
    // 16 bytes of the widest operand per thread and iteration.
    constexpr int V = std::max(1, 16 / max_size_of<Out, In...>());
    const bool vectorized = pack_aligned<V>(out) && (pack_aligned<V>(in.ptr) && ...);
    map_contiguous_kernel<V, Fast, Out, In...>
        <<<dev::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(fast, n, vectorized,
                                                                            out, in.ptr...);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  constexpr int N = sizeof...(In) + 1;
  const std::array<const Shape*, N> strides = {&out_t.strides(), &in.tensor->strides()...};
  for (const Shape* s : strides)
    ACCRUE_CHECK(s->size() == out_t.shape().size(), "elementwise: operand rank ", s->size(),
                 " differs from the output's shape ", shape_str(out_t.shape()));
  const CollapsedGeometry<N> calc = collapse_geometry<N>(out_t.shape(), strides, "elementwise");
  // Note [Rows of packs] (core/collapsed_geometry.h): a splat input reads one
  // element a row, so only the others' pointers need a pack's alignment.
  constexpr int V = std::max(1, 16 / max_size_of<Out, In...>());
  uint32_t splats = 0;
  if (V > 1 && rows_of_packs(calc, V, &splats) && pack_aligned<V>(out) &&
      inputs_aligned<V>(splats, in.ptr...)) {
    const int64_t packs = n / V;
    map_rows_kernel<V, Slow, Out, In...><<<dev::grid_for(packs, kThreads), kThreads, 0, stream>>>(
        slow, packs, RowSplitter(packs, calc.sizes[0] / V), calc.without(0), splats, out,
        in.ptr...);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  map_strided_kernel<Slow, Out, In...>
      <<<dev::grid_for(n, kThreads), kThreads, 0, stream>>>(slow, n, calc, out, in.ptr...);
  ACCRUE_LAUNCH_CHECK();
}

template <class T>
T* out_ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    with_binary_op(op, [&](auto o) {
      launch_map(BinaryFn<T, decltype(o)::value>{}, BinaryAnyFn<T>{op}, out_ptr<T>(out), out,
                 input<T>(a), input<T>(b));
    });
  });
}

void binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first, const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), "binary_scalar", [&](auto tag) {
    using T = decltype(tag);
    using M = dev::math_t<T>;
    const M sm = static_cast<M>(s);
    with_binary_op(op, [&](auto o) {
      launch_map(BinaryScalarFn<T, decltype(o)::value>{sm, scalar_first},
                 BinaryScalarAnyFn<T>{op, sm, scalar_first}, out_ptr<T>(out), out, input<T>(a));
    });
  });
}

void unary(UnaryOp op, const Tensor& a, double param, const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = dev::math_t<T>;
    const M p = static_cast<M>(param);
    with_unary_op(op, [&](auto o) {
      launch_map(UnaryFn<T, decltype(o)::value>{p}, UnaryAnyFn<T>{op, p}, out_ptr<T>(out), out,
                 input<T>(a));
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& input_t, const Tensor& output,
                    double param, const Tensor& out) {
  // Each derivative needs either the input or the output, never both: read only
  // that one (one stream of memory fewer).
  const Tensor& v = grad_uses_output(op) ? output : input_t;
  ACCRUE_CHECK(v.defined(), op_name(op), " backward: the ",
               grad_uses_output(op) ? "forward output" : "input", " is undefined");
  dev::visit_float_dtype(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = dev::math_t<T>;
    const M p = static_cast<M>(param);
    with_unary_op(op, [&](auto o) {
      launch_map(UnaryGradFn<T, decltype(o)::value>{p}, UnaryGradAnyFn<T>{op, p}, out_ptr<T>(out),
                 out, input<T>(grad), input<T>(v));
    });
  });
}

void minmax_backward(BinaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                     const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    const MinMaxGradFn<T> f{op == BinaryOp::Max};
    launch_map(f, f, out_ptr<T>(out), out, input<T>(grad), input<T>(x), input<T>(y));
  });
}

void clamp(const Tensor& a, double lo, double hi, const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), "clamp", [&](auto tag) {
    using T = decltype(tag);
    using M = dev::math_t<T>;
    const ClampFn<T> f{static_cast<M>(lo), static_cast<M>(hi)};
    launch_map(f, f, out_ptr<T>(out), out, input<T>(a));
  });
}

void clamp_backward(const Tensor& grad, const Tensor& input_t, double lo, double hi,
                    const Tensor& out) {
  dev::visit_float_dtype(out.dtype(), "clamp_backward", [&](auto tag) {
    using T = decltype(tag);
    using M = dev::math_t<T>;
    const ClampGradFn<T> f{static_cast<M>(lo), static_cast<M>(hi)};
    launch_map(f, f, out_ptr<T>(out), out, input<T>(grad), input<T>(input_t));
  });
}

namespace {

// out[i] = a[i] inside the triangle, 0 outside; (r, c) are the last two
// indices of the linear index i of the contiguous out.
template <class T>
__global__ void __launch_bounds__(kThreads)
    triangle_kernel(const T* a, StridedGeometry geometry, bool contiguous, int64_t n, int64_t rows,
                    int64_t cols, int64_t diagonal, bool upper, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t c = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? c - r >= diagonal : c - r <= diagonal;
    out[i] = keep ? a[contiguous ? i : geometry.offset_of(i)] : dev::convert<T>(0.0f);
  }
}

// The triangle over contiguous a and out whose rows are whole V-packs: a pack
// of a row at a time, its row and column found once (fast divisions), and a
// pack wholly outside the triangle written as zeros without reading a (half
// the reads of a causal mask's triu).
template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    triangle_rows_kernel(const T* a, int64_t packs, RowSplitter by_row, RowSplitter by_matrix,
                         int64_t diagonal, bool upper, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    int64_t row, pack, matrix, r;
    by_row.split(p, row, pack);
    by_matrix.split(row, matrix, r);
    const int64_t c0 = pack * V;
    // Inside is monotone in c along a row: its ends say whether any lane is in.
    const bool any = upper ? c0 + V - 1 - r >= diagonal : c0 - r <= diagonal;
    Pack<T, V> v;
    if (any) {
      v = load_pack<V>(a, p);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t c = c0 + j;
        if (!(upper ? c - r >= diagonal : c - r <= diagonal)) v.v[j] = dev::convert<T>(0.0f);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        v.v[j] = dev::convert<T>(0.0f);
    }
    store_pack<V>(out, p, v);
  }
}

}  // namespace

void triangle(const Tensor& a, int64_t diagonal, bool upper, const Tensor& out) {
  ACCRUE_CHECK(a.dim() <= kMaxDims, upper ? "triu" : "tril", ": rank ", a.dim(), " exceeds ",
               kMaxDims);
  StridedGeometry geometry;
  geometry.rank = static_cast<int32_t>(a.dim());
  for (int d = 0; d < geometry.rank; ++d) {
    geometry.sizes[d] = a.shape()[d];
    geometry.strides[d] = a.strides()[d];
  }
  const int64_t n = out.numel();
  const int device = out.device().index;
  dev::DeviceScope scope(device);
  cudaStream_t stream = dev::stream_for(device);
  dev::visit_device_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = std::max(1, 16 / static_cast<int>(sizeof(T)));
    const int64_t rows = out.size(-2), cols = out.size(-1);
    const T* in = static_cast<const T*>(a.data_ptr());
    if (V > 1 && a.is_contiguous() && out.is_contiguous() && cols % V == 0 && pack_aligned<V>(in) &&
        pack_aligned<V>(out_ptr<T>(out))) {
      const int64_t packs = n / V;
      triangle_rows_kernel<V, T><<<dev::grid_for(packs, kThreads), kThreads, 0, stream>>>(
          in, packs, RowSplitter(packs, cols / V), RowSplitter(n / cols, rows), diagonal, upper,
          out_ptr<T>(out));
      ACCRUE_LAUNCH_CHECK();
      return;
    }
    triangle_kernel<T><<<dev::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(a.data_ptr()), geometry, a.is_contiguous(), n, out.size(-2),
        out.size(-1), diagonal, upper, out_ptr<T>(out));
    ACCRUE_LAUNCH_CHECK();
  });
}

void compare(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dev::visit_device_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const CompareFn<T> f{op};
    launch_map(f, f, out_ptr<bool>(out), out, input<T>(a), input<T>(b));
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dev::visit_device_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const WhereFn<T> f{};
    launch_map(f, f, out_ptr<T>(out), out, input<bool>(cond), input<T>(a), input<T>(b));
  });
}

void axpy(const Tensor& dst, double alpha, const Tensor& src) {
  // Note [Mixed axpy]: a 16-bit src into an f32 dst, in one pass.
  if (dst.dtype() == DType::f32 && src.dtype() != DType::f32) {
    dev::visit_float_dtype(src.dtype(), "axpy", [&](auto tag) {
      using S = decltype(tag);
      if constexpr (sizeof(S) == 2) {
        const AxpyFn<float, S> f{static_cast<float>(alpha)};
        launch_map(f, f, out_ptr<float>(dst), dst, input<float>(dst), input<S>(src));
      } else {
        ACCRUE_FAIL("axpy_: src dtype ", dtype_name(src.dtype()), " into an f32 dst");
      }
    });
    return;
  }
  ACCRUE_CHECK(src.dtype() == dst.dtype(), "axpy_: src dtype ", dtype_name(src.dtype()),
               " into dst dtype ", dtype_name(dst.dtype()));
  dev::visit_float_dtype(dst.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    const AxpyFn<T> f{static_cast<dev::math_t<T>>(alpha)};
    launch_map(f, f, out_ptr<T>(dst), dst, input<T>(dst), input<T>(src));
  });
}

}  // namespace accrue::kernels::cuda
