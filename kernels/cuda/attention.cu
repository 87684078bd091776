// The composed CUDA path of scaled dot-product attention (Note [Attention
// paths] in kernels/attention.cpp): f32, f64, and bf16/f16 where cuDNN is
// absent, the layout unaligned or dropout on.
//
// Note [Composed attention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The score matrix is materialized, one [B*H, Tq, Tk] buffer in the
// accumulation dtype A (f32; f64 for f64), by cuBLASLt (the backend gemm of
// kernels/cuda/matmul.cu, which reads the strided q/k/v views in place):
//   forward:  S = scale q k^T;  one block per query row turns S into the
//             (dropped, rescaled) probabilities and writes lse;  out = P v.
//   backward: S again;  one block per row writes D_i = dO_i . O_i and the
//             dropped probabilities Pd;  dv = Pd^T dO;  dP = dO v^T;  one
//             elementwise pass dS = scale P (dP Z - D) (P recomputed from S
//             and lse, Z the dropout factors);  dq = dS k;  dk = dS^T q.
// P and dS are stored in the input dtype T (the GEMMs take operands of one
// dtype; bf16/f16 products accumulate in fp32). Products land in a contiguous
// temporary and are copied into a strided destination (out, dq, dk, dv) unless
// it is contiguous already. Every temporary comes from accrue's allocator on
// the current stream; nothing synchronizes the host. Reductions are fixed-order
// block trees and there are no atomics, so results are bitwise reproducible.
// Memory is O(B H Tq Tk): this path is the reference-grade fallback, the
// fused one is cuDNN's.
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/attention_backend.h"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

// ---- device helpers ---------------------------------------------------------------

using namespace reduce;  // exp_, log_, max_, warp/block sum and max

// What every kernel needs of the masks and the dropout (Note [Attention masks]).
struct MaskSpec {
  int64_t Tq, Tk;
  bool causal;
  double dropout_p;  // 0: no dropout
  uint64_t seed, offset;
};

// Number of keys visible from query i: keys [0, n).
__device__ __forceinline__ int64_t visible_keys(const MaskSpec& m, int64_t i) {
  return m.causal ? i + (m.Tk - m.Tq) + 1 : m.Tk;
}

// The dropout factor of element e (flat over [B, H, Tq, Tk]): keep_scale or 0.
template <class A>
__device__ __forceinline__ A dropout_factor(const MaskSpec& m, int64_t e, A keep_scale) {
  if (m.dropout_p == 0.0) return A(1);
  return attention_keep(m.seed, m.offset, e, m.dropout_p) ? keep_scale : A(0);
}

// One block per query row r of S [rows, Tk]: lse[r] = log-sum-exp of the visible
// scores, probs[r, j] = exp(S - lse) * dropout factor (0 where masked). probs may
// alias scores (P == A): each thread reads an element before writing it, and
// every read of the first two passes precedes the barriers of block_sum.
template <class A, class P>
__global__ void softmax_rows_kernel(const A* scores, P* probs, A* __restrict__ lse, MaskSpec m,
                                    A keep_scale) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t n = visible_keys(m, r % m.Tq);
  const A* s = scores + r * m.Tk;
  A mx = static_cast<A>(-INFINITY);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    mx = max_(mx, s[j]);
  mx = block_max(mx, scratch);
  A sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sum += exp_(s[j] - mx);
  sum = block_sum(sum, scratch);
  const A l = mx + log_(sum);
  if (threadIdx.x == 0) lse[r] = l;
  P* out = probs + r * m.Tk;
  for (int64_t j = threadIdx.x; j < m.Tk; j += blockDim.x) {
    A pj = 0;
    if (j < n) pj = exp_(s[j] - l) * dropout_factor(m, r * m.Tk + j, keep_scale);
    out[j] = cu::convert<P>(pj);
  }
}

// A 4-D [B, H, rows, cols] operand with unit last stride, for the row kernels.
template <class T>
struct Rows4 {
  const T* data;
  int64_t s0, s1, s2;
};

template <class T>
Rows4<T> rows4(const Tensor& t) {
  return {static_cast<const T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

// One block per query row r = (b * H + h) * Tq + i: D[r] = dO_r . O_r, and
// probs[r, :] = the dropped probabilities exp(S - lse) * Z (0 where masked).
template <class T, class A>
__global__ void backward_rows_kernel(const A* __restrict__ scores, const A* __restrict__ lse,
                                     Rows4<T> grad_out, Rows4<T> out, int64_t H, int64_t dv,
                                     MaskSpec m, A keep_scale, T* __restrict__ probs,
                                     A* __restrict__ D) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t i = r % m.Tq, bh = r / m.Tq, b = bh / H, h = bh % H;
  const T* g = grad_out.data + b * grad_out.s0 + h * grad_out.s1 + i * grad_out.s2;
  const T* o = out.data + b * out.s0 + h * out.s1 + i * out.s2;
  A dot = 0;
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
    dot += cu::convert<A>(g[c]) * cu::convert<A>(o[c]);
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) D[r] = dot;
  const int64_t n = visible_keys(m, i);
  const A l = lse[r];
  const A* s = scores + r * m.Tk;
  T* p = probs + r * m.Tk;
  for (int64_t j = threadIdx.x; j < m.Tk; j += blockDim.x) {
    A pj = 0;
    if (j < n) pj = exp_(s[j] - l) * dropout_factor(m, r * m.Tk + j, keep_scale);
    p[j] = cu::convert<T>(pj);
  }
}

// Elementwise over [B*H*Tq, Tk]: dS = scale * P * (dP * Z - D), P = exp(S - lse)
// where visible, else 0.
template <class T, class A>
__global__ void score_grad_kernel(const A* __restrict__ scores, const A* __restrict__ dp,
                                  const A* __restrict__ lse, const A* __restrict__ D, int64_t total,
                                  MaskSpec m, A scale, A keep_scale, T* __restrict__ ds) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / m.Tk, j = e - r * m.Tk;
    A g = 0;
    if (j < visible_keys(m, r % m.Tq)) {
      const A p = exp_(scores[e] - lse[r]);
      g = scale * p * (dp[e] * dropout_factor(m, e, keep_scale) - D[r]);
    }
    ds[e] = cu::convert<T>(g);
  }
}

// ---- host helpers -------------------------------------------------------------------

// Threads for one block per row of `cols` elements: about eight per thread,
// between one warp and 512 threads.
int row_threads(int64_t cols) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{8} < cols)
    threads *= 2;
  return threads;
}

void check_rows(int64_t rows) {
  ACCRUE_CHECK(rows <= std::numeric_limits<int32_t>::max(), "scaled_dot_product_attention: ", rows,
               " query rows exceed the CUDA grid limit");
}

MaskSpec mask_spec(const AttentionParams& p) {
  return {p.Tq, p.Tk, p.causal, p.dropout_p, p.seed, p.offset};
}

// The [B, H] dims of a 4-D view merged into one batch dim, when its strides
// allow (else an undefined tensor).
Tensor merge_heads(const Tensor& t) {
  const int64_t B = t.size(0), H = t.size(1);
  int64_t batch_stride;
  if (H == 1) {
    batch_stride = t.stride(0);
  } else if (B == 1 || t.stride(0) == H * t.stride(1)) {
    batch_stride = t.stride(1);
  } else {
    return Tensor();
  }
  return make_view(t, {B * H, t.size(2), t.size(3)}, {batch_stride, t.stride(2), t.stride(3)},
                   t.offset());
}

// out [B*H, M, N] (contiguous) = alpha * a [B, H, M, K] @ b [B, H, K, N], for
// operands whose last two dims are row- or column-major: one batched GEMM when
// both merge their heads (contiguous q/k/v), else one per batch entry (the heads
// of a packed qkv buffer are H-strided within a row, so B and H do not merge).
void bh_gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha) {
  const Tensor a3 = merge_heads(a), b3 = merge_heads(b);
  if (a3.defined() && b3.defined()) return gemm(a3, b3, out, alpha, 0.0);
  const int64_t B = a.size(0), H = a.size(1);
  for (int64_t i = 0; i < B; ++i)
    gemm(a.select(0, i), b.select(0, i), out.narrow(0, i * H, H), alpha, 0.0);
}

// Where a product for `dst` (4-D [B, H, M, N]) is computed: dst itself viewed
// as [B*H, M, N] when contiguous, else a contiguous temporary that finish()
// copies into dst.
struct ProductTarget {
  Tensor dst;
  Tensor buffer;
  explicit ProductTarget(const Tensor& d) : dst(d) {
    const int64_t B = d.size(0), H = d.size(1), M = d.size(2), N = d.size(3);
    buffer = d.is_contiguous() ? make_view(d, {B * H, M, N}, {M * N, N, 1}, d.offset())
                               : empty({B * H, M, N}, d.dtype(), d.device());
  }
  void finish() const {
    if (dst.is_contiguous()) return;
    dst.copy_(make_view(buffer, dst.shape(), contiguous_strides(dst.shape()), buffer.offset()));
  }
};

// A contiguous [B*H, R, C] buffer seen as 4-D [B, H, C, R]: its transpose, in place.
Tensor transposed4(const Tensor& t3, int64_t B, int64_t H) {
  const int64_t R = t3.size(1), C = t3.size(2);
  return make_view(t3, {B, H, C, R}, {H * R * C, R * C, 1, C}, t3.offset());
}

// A contiguous [B*H, R, C] buffer seen as 4-D [B, H, R, C].
Tensor split4(const Tensor& t3, int64_t B, int64_t H) {
  const int64_t R = t3.size(1), C = t3.size(2);
  return make_view(t3, {B, H, R, C}, {H * R * C, R * C, C, 1}, t3.offset());
}

DType accumulate_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse) {
  const int dev = q.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t BH = p.B * p.H, rows = BH * p.Tq;
  check_rows(rows);
  const DType acc = accumulate_dtype(q.dtype());

  // S = scale * q k^T, in A.
  Tensor scores = empty({BH, p.Tq, p.Tk}, acc, q.device());
  bh_gemm(q, k.transpose(2, 3), scores, p.scale);

  // P in the input dtype: in place over S when that is A already.
  Tensor probs = q.dtype() == acc ? scores : empty({BH, p.Tq, p.Tk}, q.dtype(), q.device());
  const MaskSpec m = mask_spec(p);
  const int threads = row_threads(p.Tk);
  cu::visit_float_dtype(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const A keep_scale = static_cast<A>(1.0 / (1.0 - p.dropout_p));
    softmax_rows_kernel<A, T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const A*>(scores.data_ptr()), static_cast<T*>(probs.data_ptr()),
        static_cast<A*>(lse.data_ptr()), m, keep_scale);
    ACCRUE_LAUNCH_CHECK();
  });

  // out = P v.
  const ProductTarget o(out);
  bh_gemm(split4(probs, p.B, p.H), v, o.buffer, 1.0);
  o.finish();
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int dev = q.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t BH = p.B * p.H, rows = BH * p.Tq;
  check_rows(rows);
  const DType acc = accumulate_dtype(q.dtype());
  const MaskSpec m = mask_spec(p);

  Tensor scores = empty({BH, p.Tq, p.Tk}, acc, q.device());
  bh_gemm(q, k.transpose(2, 3), scores, p.scale);

  // D and the dropped probabilities (later overwritten by dS, same shape and dtype).
  Tensor D = empty({rows}, acc, q.device());
  Tensor probs = empty({BH, p.Tq, p.Tk}, q.dtype(), q.device());
  cu::visit_float_dtype(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const A keep_scale = static_cast<A>(1.0 / (1.0 - p.dropout_p));
    backward_rows_kernel<T, A><<<static_cast<unsigned>(rows), row_threads(p.Tk), 0, stream>>>(
        static_cast<const A*>(scores.data_ptr()), static_cast<const A*>(lse.data_ptr()),
        rows4<T>(grad_out), rows4<T>(out), p.H, p.dv, m, keep_scale,
        static_cast<T*>(probs.data_ptr()), static_cast<A*>(D.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });

  // dv = Pd^T dO.
  const ProductTarget dv_target(dv);
  bh_gemm(transposed4(probs, p.B, p.H), grad_out, dv_target.buffer, 1.0);
  dv_target.finish();

  // dP = dO v^T, then dS over the probabilities' buffer.
  Tensor dp = empty({BH, p.Tq, p.Tk}, acc, q.device());
  bh_gemm(grad_out, v.transpose(2, 3), dp, 1.0);
  const Tensor& ds = probs;
  cu::visit_float_dtype(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const A keep_scale = static_cast<A>(1.0 / (1.0 - p.dropout_p));
    constexpr int kThreads = 256;
    const int64_t total = rows * p.Tk;
    score_grad_kernel<T, A><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const A*>(scores.data_ptr()), static_cast<const A*>(dp.data_ptr()),
        static_cast<const A*>(lse.data_ptr()), static_cast<const A*>(D.data_ptr()), total, m,
        static_cast<A>(p.scale), keep_scale, static_cast<T*>(ds.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });

  // dq = dS k, dk = dS^T q (the scale is inside dS).
  const ProductTarget dq_target(dq);
  bh_gemm(split4(ds, p.B, p.H), k, dq_target.buffer, 1.0);
  dq_target.finish();
  const ProductTarget dk_target(dk);
  bh_gemm(transposed4(ds, p.B, p.H), q, dk_target.buffer, 1.0);
  dk_target.finish();
}

}  // namespace accrue::kernels::cuda
