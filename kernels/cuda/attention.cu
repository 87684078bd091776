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
// dtype; bf16/f16 products accumulate in fp32). Grouped-query heads are never
// expanded: a product with k or v runs per (batch, kv head) with the kv
// operand shared across the group's query heads (batch stride 0), and dk, dv
// are formed per query head in A and summed over each group in head order.
// Masks, lengths, documents and the bias follow Note [Attention masks] in
// every row kernel; dbias sums the score gradient over the bias's broadcast
// dims in a fixed order. Products land in a contiguous
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

// What every kernel needs of the masks, the bias and the dropout (Note
// [Attention masks]).
struct MaskSpec {
  AttentionMaskSpec rows;
  int64_t H;
  double dropout_p;  // 0: no dropout
  uint64_t seed, offset;
  const void* bias;  // the [B, H, Tq, Tk] view's data (T or bool); null: none
  int64_t bs0, bs1, bs2;
  bool bias_is_mask;
};

// What the scaled score of (b, h, i, j) gets added: the bias, or 0 / -inf
// for a boolean mask.
template <class T, class A>
__device__ __forceinline__ A bias_term(const MaskSpec& m, int64_t b, int64_t h, int64_t i,
                                       int64_t j) {
  if (!m.bias) return A(0);
  const int64_t e = b * m.bs0 + h * m.bs1 + i * m.bs2 + j;
  if (m.bias_is_mask) return static_cast<const bool*>(m.bias)[e] ? A(0) : static_cast<A>(-INFINITY);
  return cu::convert<A>(static_cast<const T*>(m.bias)[e]);
}

// The dropout factor of element e (flat over [B, H, Tq, Tk]): keep_scale or 0.
template <class A>
__device__ __forceinline__ A dropout_factor(const MaskSpec& m, int64_t e, A keep_scale) {
  if (m.dropout_p == 0.0) return A(1);
  return attention_keep(m.seed, m.offset, e, m.dropout_p) ? keep_scale : A(0);
}

// One block per query row r = (b * H + h) * Tq + i of S [rows, Tk]: lse[r] =
// log-sum-exp of the visible biased scores (-inf for an empty row), probs[r,
// j] = exp(S + bias - lse) * dropout factor (0 where masked). probs may alias
// scores (P == A): each thread reads an element before writing it, and every
// read of the first two passes precedes the barriers of block_sum.
template <class A, class P>
__global__ void softmax_rows_kernel(const A* scores, P* probs, A* __restrict__ lse, MaskSpec m,
                                    A keep_scale) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t Tq = m.rows.Tq, Tk = m.rows.Tk;
  const int64_t i = r % Tq, bh = r / Tq, b = bh / m.H, h = bh % m.H;
  const AttentionRow row = attention_row(m.rows, b, i);
  const A* s = scores + r * Tk;
  A mx = static_cast<A>(-INFINITY);
  for (int64_t j = row.lo + threadIdx.x; j < row.hi; j += blockDim.x)
    mx = max_(mx, s[j] + bias_term<P, A>(m, b, h, i, j));
  mx = block_max(mx, scratch);
  const bool empty_row = mx == static_cast<A>(-INFINITY);
  A sum = 0;
  if (!empty_row)
    for (int64_t j = row.lo + threadIdx.x; j < row.hi; j += blockDim.x)
      sum += exp_(s[j] + bias_term<P, A>(m, b, h, i, j) - mx);
  sum = block_sum(sum, scratch);
  const A l = empty_row ? static_cast<A>(-INFINITY) : mx + log_(sum);
  if (threadIdx.x == 0) lse[r] = l;
  P* out = probs + r * Tk;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    A pj = 0;
    if (!empty_row && j >= row.lo && j < row.hi)
      pj = exp_(s[j] + bias_term<P, A>(m, b, h, i, j) - l) *
           dropout_factor(m, r * Tk + j, keep_scale);
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

// The undropped probability of (b, h, i, j) from its score, 0 where masked
// or in an empty row.
template <class T, class A>
__device__ __forceinline__ A probability(const MaskSpec& m, const AttentionRow& row, A s, A l,
                                         int64_t b, int64_t h, int64_t i, int64_t j) {
  if (j < row.lo || j >= row.hi || l == static_cast<A>(-INFINITY)) return A(0);
  const A t = bias_term<T, A>(m, b, h, i, j);
  if (t == static_cast<A>(-INFINITY)) return A(0);
  return exp_(s + t - l);
}

// One block per query row r = (b * H + h) * Tq + i: D[r] = dO_r . O_r, and
// probs[r, :] = the dropped probabilities exp(S + bias - lse) * Z (0 where masked).
template <class T, class A>
__global__ void backward_rows_kernel(const A* __restrict__ scores, const A* __restrict__ lse,
                                     Rows4<T> grad_out, Rows4<T> out, int64_t dv, MaskSpec m,
                                     A keep_scale, T* __restrict__ probs, A* __restrict__ D) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t Tq = m.rows.Tq, Tk = m.rows.Tk;
  const int64_t i = r % Tq, bh = r / Tq, b = bh / m.H, h = bh % m.H;
  const T* g = grad_out.data + b * grad_out.s0 + h * grad_out.s1 + i * grad_out.s2;
  const T* o = out.data + b * out.s0 + h * out.s1 + i * out.s2;
  A dot = 0;
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
    dot += cu::convert<A>(g[c]) * cu::convert<A>(o[c]);
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) D[r] = dot;
  const AttentionRow row = attention_row(m.rows, b, i);
  const A l = lse[r];
  const A* s = scores + r * Tk;
  T* p = probs + r * Tk;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x)
    p[j] = cu::convert<T>(probability<T, A>(m, row, s[j], l, b, h, i, j) *
                          dropout_factor(m, r * Tk + j, keep_scale));
}

// Elementwise over [B*H*Tq, Tk]: dS = P * (dP * Z - D) (P recomputed, 0 where
// masked); ds = scale * dS in T for the products, and dS itself in place of
// dp when the bias wants its gradient.
template <class T, class A>
__global__ void score_grad_kernel(const A* __restrict__ scores, A* dp, const A* __restrict__ lse,
                                  const A* __restrict__ D, int64_t total, MaskSpec m, A scale,
                                  A keep_scale, bool keep_raw, T* __restrict__ ds) {
  const int64_t Tq = m.rows.Tq, Tk = m.rows.Tk;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / Tk, j = e - r * Tk;
    const int64_t i = r % Tq, bh = r / Tq, b = bh / m.H, h = bh % m.H;
    const AttentionRow row = attention_row(m.rows, b, i);
    const A p = probability<T, A>(m, row, scores[e], lse[r], b, h, i, j);
    A g = 0;
    if (p != A(0)) g = p * (dp[e] * dropout_factor(m, e, keep_scale) - D[r]);
    if (keep_raw) dp[e] = g;
    ds[e] = cu::convert<T>(scale * g);
  }
}

// dbias [Bb, Hb, Tq, Tk] (contiguous) = the raw score gradient [B, H, Tq, Tk]
// summed over the dims the bias broadcasts (Bb == 1 or Hb == 1), b then h in order.
template <class T, class A>
__global__ void bias_grad_kernel(const A* __restrict__ dsr, int64_t B, int64_t H, int64_t Bb,
                                 int64_t Hb, int64_t TqTk, T* __restrict__ dbias) {
  const int64_t total = Bb * Hb * TqTk;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ij = e % TqTk, bh = e / TqTk, bb = bh / Hb, hb = bh % Hb;
    A acc = 0;
    for (int64_t b = (Bb == 1 ? 0 : bb); b < (Bb == 1 ? B : bb + 1); ++b)
      for (int64_t h = (Hb == 1 ? 0 : hb); h < (Hb == 1 ? H : hb + 1); ++h)
        acc += dsr[(b * H + h) * TqTk + ij];
    dbias[e] = cu::convert<T>(acc);
  }
}

// out [B*Hkv, R, C] = the sum over each group's g query heads of full [B*H,
// R, C] (both contiguous), in head order.
template <class T, class A>
__global__ void group_sum_kernel(const A* __restrict__ full, int64_t total, int64_t g, int64_t RC,
                                 T* __restrict__ out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t head = e / RC, rc = e - head * RC;
    A acc = 0;
    for (int64_t r = 0; r < g; ++r)
      acc += full[(head * g + r) * RC + rc];
    out[e] = cu::convert<T>(acc);
  }
}

// Rows t >= len[b] of x [B, H, T, C] become 0; lse's, -inf.
template <class T>
__global__ void zero_padding_kernel(T* x, int64_t s0, int64_t s1, int64_t s2, int64_t H, int64_t T_,
                                    int64_t C, const int64_t* __restrict__ len, float* lse,
                                    int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % C, row = e / C, t = row % T_, bh = row / T_, b = bh / H, h = bh % H;
    if (t < attention_clamp(len[b], 0, T_)) continue;
    x[b * s0 + h * s1 + t * s2 + c] = cu::convert<T>(0.0f);
    if (lse && c == 0) lse[row] = -INFINITY;
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
  MaskSpec m{};
  m.rows = attention_mask_spec(p);
  m.H = p.H;
  m.dropout_p = p.dropout_p;
  m.seed = p.seed;
  m.offset = p.offset;
  if (p.bias.defined()) {
    m.bias = p.bias.data_ptr();
    m.bs0 = p.bias.stride(0);
    m.bs1 = p.bias.stride(1);
    m.bs2 = p.bias.stride(2);
    m.bias_is_mask = p.bias_is_mask;
  }
  return m;
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

// out [B*H, M, N] (contiguous) = alpha * a [B, H, M, K] @ b [B, Hkv, K, N]:
// query head h against kv head h / (H / Hkv), the kv operand shared across
// its group by a batch stride of 0 (one product per batch entry and kv head).
void gqa_gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha) {
  const int64_t B = a.size(0), H = a.size(1), Hkv = b.size(1);
  if (Hkv == H) return bh_gemm(a, b, out, alpha);
  const int64_t g = H / Hkv;
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      const Tensor b2 = b.select(0, i).select(0, hk);
      const Tensor b3 =
          make_view(b2, {g, b2.size(0), b2.size(1)}, {0, b2.stride(0), b2.stride(1)}, b2.offset());
      gemm(a.select(0, i).narrow(0, hk * g, g), b3, out.narrow(0, i * H + hk * g, g), alpha, 0.0);
    }
  }
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
  gqa_gemm(q, k.transpose(2, 3), scores, p.scale);

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
  gqa_gemm(split4(probs, p.B, p.H), v, o.buffer, 1.0);
  o.finish();
}

namespace {

// dst [B, Hkv, R, C] = the group sums of a [B, H, R, C] product a @ b whose
// operands both have the query heads: one batched product into A, then
// group_sum_kernel (or the product straight into dst without groups).
void grouped_product(const Tensor& a, const Tensor& b, const Tensor& dst, const AttentionParams& p,
                     cudaStream_t stream) {
  const ProductTarget target(dst);
  if (p.Hkv == p.H) {
    bh_gemm(a, b, target.buffer, 1.0);
    target.finish();
    return;
  }
  const int64_t R = dst.size(2), C = dst.size(3);
  Tensor full = empty({p.B * p.H, R, C}, accumulate_dtype(dst.dtype()), dst.device());
  bh_gemm(a, b, full, 1.0);
  cu::visit_float_dtype(dst.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    constexpr int kThreads = 256;
    const int64_t total = target.buffer.numel();
    group_sum_kernel<T, A><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const A*>(full.data_ptr()), total, p.group(), R * C,
        static_cast<T*>(target.buffer.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
  target.finish();
}

}  // namespace

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  const int dev = q.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t BH = p.B * p.H, rows = BH * p.Tq;
  check_rows(rows);
  const DType acc = accumulate_dtype(q.dtype());
  const MaskSpec m = mask_spec(p);

  Tensor scores = empty({BH, p.Tq, p.Tk}, acc, q.device());
  gqa_gemm(q, k.transpose(2, 3), scores, p.scale);

  // D and the dropped probabilities (later overwritten by dS, same shape and dtype).
  Tensor D = empty({rows}, acc, q.device());
  Tensor probs = empty({BH, p.Tq, p.Tk}, q.dtype(), q.device());
  cu::visit_float_dtype(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const A keep_scale = static_cast<A>(1.0 / (1.0 - p.dropout_p));
    backward_rows_kernel<T, A><<<static_cast<unsigned>(rows), row_threads(p.Tk), 0, stream>>>(
        static_cast<const A*>(scores.data_ptr()), static_cast<const A*>(lse.data_ptr()),
        rows4<T>(grad_out), rows4<T>(out), p.dv, m, keep_scale, static_cast<T*>(probs.data_ptr()),
        static_cast<A*>(D.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });

  // dv = Pd^T dO, summed over each kv head's group.
  grouped_product(transposed4(probs, p.B, p.H), grad_out, dv, p, stream);

  // dP = dO v^T, then dS over the probabilities' buffer (and, for dbias, the
  // unscaled dS over dP's).
  Tensor dp = empty({BH, p.Tq, p.Tk}, acc, q.device());
  gqa_gemm(grad_out, v.transpose(2, 3), dp, 1.0);
  const Tensor& ds = probs;
  cu::visit_float_dtype(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const A keep_scale = static_cast<A>(1.0 / (1.0 - p.dropout_p));
    constexpr int kThreads = 256;
    const int64_t total = rows * p.Tk;
    score_grad_kernel<T, A><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const A*>(scores.data_ptr()), static_cast<A*>(dp.data_ptr()),
        static_cast<const A*>(lse.data_ptr()), static_cast<const A*>(D.data_ptr()), total, m,
        static_cast<A>(p.scale), keep_scale, dbias.defined(), static_cast<T*>(ds.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
    if (dbias.defined()) {
      const int64_t n = dbias.numel();
      bias_grad_kernel<T, A><<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const A*>(dp.data_ptr()), p.B, p.H, dbias.size(0), dbias.size(1), p.Tq * p.Tk,
          static_cast<T*>(dbias.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    }
  });

  // dq = dS k, dk = dS^T q (the scale is inside dS), dk summed over each group.
  const ProductTarget dq_target(dq);
  gqa_gemm(split4(ds, p.B, p.H), k, dq_target.buffer, 1.0);
  dq_target.finish();
  grouped_product(transposed4(ds, p.B, p.H), q, dk, p, stream);
}

void attention_zero_padding(const Tensor& x, const Tensor& len, const Tensor& lse) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t total = x.numel();
  if (total == 0) return;
  cu::visit_float_dtype(x.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    zero_padding_kernel<T><<<cu::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(x.data_ptr()), x.stride(0), x.stride(1), x.stride(2), x.size(1), x.size(2),
        x.size(3), static_cast<const int64_t*>(len.data_ptr()),
        lse.defined() ? static_cast<float*>(lse.data_ptr()) : nullptr, total);
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::kernels::cuda
