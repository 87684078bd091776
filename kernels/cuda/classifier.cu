// CUDA kernels of the fused classifier (Note [Fused classifier]): the per-row
// log-sum-exp that overwrites a chunk's logits with softmax - onehot (Note
// [Classifier row kernel]), the fixed-order loss total, and the seed scaling
// of backward.
//
// Like the cross-entropy kernels of kernels/cuda/cross_entropy.cu, every reduction runs
// in a fixed order (warp shuffles in a fixed lane order, then the warps in
// order; the row losses added by one block in row order): no float atomics,
// so the same inputs give the same bits on every run. 16-bit inputs compute
// in fp32, f64 in f64. Everything launches on the current stream and nothing
// synchronizes the host.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/classifier_backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;
using dispatch_util::check_dtype;  // the backend's own invariants, checked cheaply

namespace {

using namespace reduce;  // load, warp_sum, block_sum, loss_total_kernel

// ---- the row kernel -------------------------------------------------------------------

// Note [Classifier row kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// classifier_rows is memory-bound: a GPT-2 chunk row is 50304 bf16 logits
// (100 KB) that must be read once and overwritten once, and that traffic is
// the floor. One block per row:
//  - Layout. A row splits into a scalar head (its columns before the first
//    16-byte boundary), 16-byte packs (8 x bf16/f16, 4 x f32, 2 x f64) and a
//    scalar tail, so any width and any row start work (rows of a width that
//    is not a multiple of the pack start misaligned) while all but a few
//    columns move in 16-byte loads and stores. Thread i owns packs i,
//    i + blockDim, ... and at most one head and one tail column.
//  - One read. Each thread loads its first kCachedPacks<T> packs into
//    registers before any arithmetic (GPT-2's whole row, 100 KB of loads in
//    flight per block) and keeps them for pass 2, which then reads nothing: a
//    row of up to kMaxRowThreads<T> x kCachedPacks<T> packs (57344 bf16
//    columns) is read from memory exactly once. Packs past those are read
//    again in pass 2 (from L2 while it holds them): correct at any width.
//  - Pass 1: each thread keeps a running (max, sum of exp(x - max)) over its
//    columns, a pack at a time (the pack's max first, so the sum is rescaled
//    once per pack, not per element), and the block merges the threads'
//    pairs (block_log_sum_exp). Its barrier separates every read of the row's
//    original values (the target logit's included) from pass 2's writes.
//  - Pass 2: each thread overwrites what it owns with softmax - onehot (0 in
//    the padded columns), in 16-byte streaming stores.
// The arithmetic is the CPU reference's in fp32 (f64 for f64): the max first,
// for stability; for fp32, exp and log in base 2 (Note [Classifier exp in
// base 2]). Which columns each thread adds in which order, the warp merges'
// lane order and the block merge's warp order depend only on the row's width
// and start address, so the same inputs give the same bits on every run.
//
// The loads do not wait for the row's target: an ignored row (rare) runs pass
// 1 like any other and then writes zeros, rather than every row delaying its
// loads by the target's read.

// Elements of T in one 16-byte pack.
template <class T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

// Threads of a row's block at most, and the packs each thread keeps in
// registers. For fp32 and 16-bit: 1024 threads, so __launch_bounds__ leaves
// 64 registers a thread, 28 of which hold 7 packs (GPT-2's 6288 packs a row
// need 7 in some threads; 8 would spill). f64 (a reference dtype, not a fast
// one) needs registers for its exp: 512 threads (up to 128 registers), 4 packs.
template <class T>
constexpr int kMaxRowThreads = sizeof(T) == 8 ? 512 : 1024;
template <class T>
constexpr int kCachedPacks = sizeof(T) == 8 ? 4 : 7;

// Note [Classifier exp in base 2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// For fp32 the kernel works in units of log2(e): maxes are kept as
// m * log2(e), so exp(x - m) = exp2(fma(x, log2(e), -m * log2(e))), one FFMA
// and one MUFU.EX2 per element where expf's range reduction takes about
// eight instructions and would make the kernel compute-bound. The fma rounds
// once, as x - m does inside expf, so the terms differ from expf's by about
// 1e-6 relative: far under a bf16 output's 2^-9, inside the f32 tests'
// tolerance. The log-sum-exp is max + log2(sum) in the same units; the row
// loss converts it back (times ln 2) before subtracting the target logit.
//
// Pass 1 (the sum and its rescalings, the merges) takes MUFU.EX2 as it is,
// flushing results under 2^-126 to 0, which the sum cannot feel: every
// partial sum holds its own max's term, about 1 (the rescaling factor of the
// larger max is exp2(0) = 1), so a flushed term is some 2^100 times under the
// sum's ulp. Pass 2's outputs are exactly exp2f's, subnormal ones included
// (exp_outputs). f64 keeps exp and log.
__device__ __forceinline__ float exp2_flush(float y) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}

template <class A>
struct Exp;

template <>
struct Exp<float> {
  static constexpr float kLog2e = 1.44269504088896340736f;
  static constexpr float kLn2 = 0.693147180559945309417f;
  // x in the kernel's units.
  static __device__ __forceinline__ float scaled(float x) { return x * kLog2e; }
  // x - ref in the kernel's units for a raw x, the reference given as -ref.
  static __device__ __forceinline__ float exponent(float x, float neg_ref) {
    return fmaf(x, kLog2e, neg_ref);
  }
  // Pass 1's exp of an exponent (flushing: see the Note).
  static __device__ __forceinline__ float exp(float y) { return exp2_flush(y); }
  // Pass 2's exp of N exponents in place, each result exactly exp2f's: the
  // flushing instruction when no result is subnormal (the min exponent is
  // >= -126; NaN fails the test), exp2f otherwise.
  template <int N>
  static __device__ __forceinline__ void exp_outputs(float (&y)[N]) {
    float low = y[0];
#pragma unroll
    for (int i = 1; i < N; ++i)
      low = fminf(low, y[i]);
    if (low >= -126.0f) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        y[i] = exp2_flush(y[i]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i)
        y[i] = exp2f(y[i]);
    }
  }
  // log of a sum into the kernel's units; a value in them back to raw.
  static __device__ __forceinline__ float log(float s) {
    return log2f(s);
  }
  static __device__ __forceinline__ float unscaled(float y) {
    return y * kLn2;
  }
};

template <>
struct Exp<double> {
  static __device__ __forceinline__ double scaled(double x) { return x; }
  static __device__ __forceinline__ double exponent(double x, double neg_ref) {
    return x + neg_ref;
  }
  static __device__ __forceinline__ double exp(double y) { return ::exp(y); }
  template <int N>
  static __device__ __forceinline__ void exp_outputs(double (&y)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      y[i] = ::exp(y[i]);
  }
  static __device__ __forceinline__ double log(double s) {
    return ::log(s);
  }
  static __device__ __forceinline__ double unscaled(double y) {
    return y;
  }
};

// A running (max, sum of exp(x - max)), max in Exp<A>'s units. The max never
// holds NaN (fmax drops it); a NaN logit reaches the sum instead, and the
// sum stays NaN from then on.
template <class A>
struct LogSumExp {
  A max;
  A sum;
};

// The reference of a sum: the max, or 0 while the max is -inf (every column
// so far -inf or NaN: the sum is 0 or NaN, and exp(-inf - -inf) must not
// make a 0 sum NaN).
template <class A>
__device__ __forceinline__ A reference(A max) {
  return max == static_cast<A>(-INFINITY) ? A(0) : max;
}

// The pair of a and b (commutative to the bit: fmax and a sum of two products).
template <class A>
__device__ __forceinline__ LogSumExp<A> merge(LogSumExp<A> a, LogSumExp<A> b) {
  const A top = fmax(a.max, b.max);
  const A ref = reference(top);
  return {top, a.sum * Exp<A>::exp(a.max - ref) + b.sum * Exp<A>::exp(b.max - ref)};
}

// acc with N more raw values added (-inf for a column outside the softmax):
// the values' max first, then one rescale of the sum and N terms summed as a
// tree.
template <int N, class A>
__device__ __forceinline__ LogSumExp<A> add_values(LogSumExp<A> acc, const A (&x)[N]) {
  A m = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i)
    m = fmax(m, x[i]);
  const A top = fmax(acc.max, Exp<A>::scaled(m));
  const A neg_ref = -reference(top);
  A terms[N];
#pragma unroll
  for (int i = 0; i < N; ++i)
    terms[i] = Exp<A>::exp(Exp<A>::exponent(x[i], neg_ref));
#pragma unroll
  for (int width = 1; width < N; width *= 2)
#pragma unroll
    for (int i = 0; i + width < N; i += 2 * width)
      terms[i] += terms[i + width];
  return {top, acc.sum * Exp<A>::exp(acc.max + neg_ref) + terms[0]};
}

// The elements of a 16-byte pack as A, and back (rounded once).
template <class T, class A>
__device__ __forceinline__ void unpack(uint4 raw, A (&x)[kPack<T>]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // A bf16 is the top half of its fp32: one shift or mask per element.
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      x[2 * w] = __uint_as_float(words[w] << 16);
      x[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
    }
  } else {
    T e[kPack<T>];
    memcpy(e, &raw, sizeof(raw));
#pragma unroll
    for (int i = 0; i < kPack<T>; ++i)
      x[i] = load<A>(e[i]);
  }
}

template <class T, class A>
__device__ __forceinline__ uint4 pack(const A (&d)[kPack<T>]) {
  T e[kPack<T>];
#pragma unroll
  for (int i = 0; i < kPack<T>; ++i)
    e[i] = cu::convert<T>(d[i]);
  uint4 raw;
  memcpy(&raw, e, sizeof(raw));
  return raw;
}

// Pass 1 over the pack whose first column is `first`.
template <class T, class A>
__device__ __forceinline__ LogSumExp<A> add_pack(LogSumExp<A> acc, uint4 raw, int first,
                                                 int valid) {
  constexpr int P = kPack<T>;
  A x[P];
  unpack<T>(raw, x);
  if (first + P > valid) {  // reaches the padded columns: they take no part
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (first + i >= valid) x[i] = static_cast<A>(-INFINITY);
  }
  return add_values(acc, x);
}

// Pass 2 over the pack whose first column is `first`: softmax - onehot(target),
// 0 in the padded columns.
template <class T, class A>
__device__ __forceinline__ uint4 softmax_pack(uint4 raw, int first, int valid, int target,
                                              A neg_lse) {
  constexpr int P = kPack<T>;
  A d[P];
  unpack<T>(raw, d);
#pragma unroll
  for (int i = 0; i < P; ++i)
    d[i] = Exp<A>::exponent(d[i], neg_lse);
  Exp<A>::exp_outputs(d);
  if (first + P > valid) {
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (first + i >= valid) d[i] = A(0);
  }
  if (static_cast<unsigned>(target - first) < static_cast<unsigned>(P)) {  // one pack of the row
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (first + i == target) d[i] -= A(1);
  }
  return pack<T>(d);
}

// A pack of `value` in the valid columns and 0 in the padded ones.
template <class T, class A>
__device__ __forceinline__ uint4 fill_pack(int first, int valid, A value) {
  A d[kPack<T>];
#pragma unroll
  for (int i = 0; i < kPack<T>; ++i)
    d[i] = first + i < valid ? value : A(0);
  return pack<T>(d);
}

// The head / packs / tail split of a row: see Note [Classifier row kernel].
// A row starts on a whole element (every tensor's data does), so the head is
// fewer than kPack<T> columns. Columns are int: the host checks cols.
template <class T>
struct RowSplit {
  int head;   // scalar columns [0, head) before the first 16-byte boundary
  int packs;  // packs of kPack<T> columns from column head on
  int tail;   // scalar columns [tail, cols) after them
  __device__ RowSplit(const T* row, int cols) {
    const int misalign = static_cast<int>(reinterpret_cast<uintptr_t>(row) % 16);
    head = misalign == 0 ? 0 : (16 - misalign) / static_cast<int>(sizeof(T));
    if (head > cols) head = cols;
    packs = (cols - head) / kPack<T>;
    tail = head + packs * kPack<T>;
  }
  // The scalar column this thread owns in the head (which = 0) or the tail
  // (which = 1), or -1.
  __device__ int scalar_column(int which, int cols) const {
    const int c = which == 0 ? static_cast<int>(threadIdx.x) : tail + static_cast<int>(threadIdx.x);
    return c < (which == 0 ? head : cols) ? c : -1;
  }
};

// The block's merge of every thread's pair, returned to every thread (the
// warps' butterflies, then warp 0..31's results in order). Its barrier comes
// after every read the threads made before calling it.
template <class A>
__device__ LogSumExp<A> block_log_sum_exp(LogSumExp<A> v) {
  __shared__ A scratch_max[32], scratch_sum[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    v = merge(v, LogSumExp<A>{__shfl_xor_sync(0xffffffffu, v.max, offset),
                              __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    scratch_max[warp] = v.max;
    scratch_sum[warp] = v.sum;
  }
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? LogSumExp<A>{scratch_max[lane], scratch_sum[lane]}
                                               : LogSumExp<A>{static_cast<A>(-INFINITY), A(0)};
  for (int offset = 16; offset > 0; offset >>= 1)
    v = merge(v, LogSumExp<A>{__shfl_xor_sync(0xffffffffu, v.max, offset),
                              __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  return v;
}

// One block per row of a chunk (Note [Classifier row kernel]): row_loss[r] =
// lse(x[0, valid)) - x[t], then the row becomes softmax - onehot over
// [0, valid) and 0 over [valid, cols). An ignored row becomes 0 with loss 0.
template <class T, class I, class A>
__global__ void __launch_bounds__(kMaxRowThreads<T>, 1)
    classifier_rows_kernel(T* __restrict__ logits, const I* __restrict__ targets, int cols,
                           int valid, int64_t ignore_index, A* __restrict__ row_loss) {
  constexpr int P = kPack<T>;
  const int threads = blockDim.x, tid = threadIdx.x;
  T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  const RowSplit<T> split(row, cols);
  uint4* packs = reinterpret_cast<uint4*>(row + split.head);

  // Every load first, none waiting on the target (see Note [Classifier row kernel]).
  uint4 cache[kCachedPacks<T>];
#pragma unroll
  for (int k = 0; k < kCachedPacks<T>; ++k) {
    const int j = k * threads + tid;
    cache[k] = j < split.packs ? __ldcs(packs + j) : uint4{0, 0, 0, 0};
  }
  const int64_t t = static_cast<int64_t>(targets[blockIdx.x]);
  const bool ignored = t == ignore_index;
  // In [0, valid) or -1; a target outside both is only possible with index checks off.
  const int target = !ignored && t >= 0 && t < valid ? static_cast<int>(t) : -1;
  // Read before block_log_sum_exp's barrier, hence before any thread overwrites it.
  const A target_logit = tid == 0 && target >= 0 ? load<A>(row[target]) : A(0);

  // Pass 1.
  LogSumExp<A> acc{static_cast<A>(-INFINITY), A(0)};
  for (int which = 0; which < 2; ++which) {
    const int c = split.scalar_column(which, cols);
    if (c >= 0) {
      const A x[1] = {c < valid ? load<A>(row[c]) : static_cast<A>(-INFINITY)};
      acc = add_values(acc, x);
    }
  }
#pragma unroll
  for (int k = 0; k < kCachedPacks<T>; ++k) {
    const int j = k * threads + tid;
    if (j < split.packs) acc = add_pack<T>(acc, cache[k], split.head + j * P, valid);
  }
  for (int j = kCachedPacks<T> * threads + tid; j < split.packs; j += threads)
    acc = add_pack<T>(acc, packs[j], split.head + j * P, valid);
  acc = block_log_sum_exp(acc);
  const A lse = acc.max + Exp<A>::log(acc.sum);  // in Exp<A>'s units

  // Pass 2.
  if (target < 0) {  // uniform over the block
    // 0, or NaN in the valid columns of a bad row to make it visible.
    const A fill = ignored ? A(0) : static_cast<A>(NAN);
#pragma unroll
    for (int k = 0; k < kCachedPacks<T>; ++k) {
      const int j = k * threads + tid;
      if (j < split.packs) __stcs(packs + j, fill_pack<T>(split.head + j * P, valid, fill));
    }
    for (int j = kCachedPacks<T> * threads + tid; j < split.packs; j += threads)
      __stcs(packs + j, fill_pack<T>(split.head + j * P, valid, fill));
    for (int which = 0; which < 2; ++which) {
      const int c = split.scalar_column(which, cols);
      if (c >= 0) row[c] = cu::convert<T>(c < valid ? fill : A(0));
    }
    if (tid == 0) row_loss[blockIdx.x] = fill;
    return;
  }
  const A neg_lse = -lse;
#pragma unroll
  for (int k = 0; k < kCachedPacks<T>; ++k) {
    const int j = k * threads + tid;
    if (j < split.packs)
      __stcs(packs + j, softmax_pack<T>(cache[k], split.head + j * P, valid, target, neg_lse));
  }
  for (int j = kCachedPacks<T> * threads + tid; j < split.packs; j += threads)
    __stcs(packs + j,
           softmax_pack<T>(__ldcs(packs + j), split.head + j * P, valid, target, neg_lse));
  for (int which = 0; which < 2; ++which) {
    const int c = split.scalar_column(which, cols);
    if (c >= 0) {
      A d = A(0);
      if (c < valid) {
        A e[1] = {Exp<A>::exponent(load<A>(row[c]), neg_lse)};
        Exp<A>::exp_outputs(e);
        d = c == target ? e[0] - A(1) : e[0];
      }
      row[c] = cu::convert<T>(d);
    }
  }
  if (tid == 0) row_loss[blockIdx.x] = Exp<A>::unscaled(lse) - target_logit;
}

// out = x * seed in A, rounded once; seed is read on the device. x may be out
// itself (each element is read, then written, by one thread): no __restrict__.
template <class X, class T, class A>
__global__ void scale_by_seed_kernel(const X* x, const A* __restrict__ seed, int64_t n, T* out) {
  const A g = *seed;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cu::convert<T>(load<A>(x[i]) * g);
}

// Threads for one block per row of `cols` elements of T: about four 16-byte
// packs per thread (fewer when fewer are cached), between one warp and
// kMaxRowThreads<T> (a power of two, so a multiple of 32 as the block merges
// need). See Note [Classifier row kernel].
template <class T>
int row_threads(int64_t cols) {
  const int64_t packs = cols / kPack<T>, per_thread = std::min(4, kCachedPacks<T>);
  int threads = 32;
  while (threads < kMaxRowThreads<T> && threads * per_thread < packs)
    threads *= 2;
  return threads;
}

constexpr int kThreads = 256;

}  // namespace

void classifier_rows(const Tensor& logits, const Tensor& targets, int64_t valid_classes,
                     int64_t ignore_index, const Tensor& row_loss) {
  const int dev = logits.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  ACCRUE_CHECK(rows <= std::numeric_limits<int32_t>::max(), "classifier_rows: ", rows,
               " rows exceed the CUDA grid limit");
  // The row kernel indexes columns in int (fewer registers next to its cached
  // packs), a column plus a thread index included.
  ACCRUE_CHECK(cols <= std::numeric_limits<int32_t>::max() - 1024, "classifier_rows: ", cols,
               " columns per row exceed the row kernel's int32 column index");
  cu::visit_float_dtype(logits.dtype(), "classifier_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    check_dtype(row_loss, std::is_same_v<A, double> ? DType::f64 : DType::f32, "classifier_rows",
                "row_loss");
    visit_index_dtype(targets.dtype(), "classifier_rows", [&](auto index_tag) {
      using I = decltype(index_tag);
      classifier_rows_kernel<T, I, A>
          <<<static_cast<unsigned>(rows), row_threads<T>(cols), 0, cu::stream_for(dev)>>>(
              static_cast<T*>(logits.data_ptr()), static_cast<const I*>(targets.data_ptr()),
              static_cast<int>(cols), static_cast<int>(valid_classes), ignore_index,
              static_cast<A*>(row_loss.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void classifier_total(const Tensor& row_loss, const Tensor& targets, int64_t ignore_index,
                      const Tensor& sum, const Tensor& count) {
  const int dev = row_loss.device().index;
  cu::DeviceScope scope(dev);
  check_dtype(sum, row_loss.dtype(), "classifier_total", "sum");
  check_dtype(count, DType::i64, "classifier_total", "count");
  const int64_t rows = row_loss.numel();
  auto launch = [&](auto loss_tag) {
    using A = decltype(loss_tag);
    visit_index_dtype(targets.dtype(), "classifier_total", [&](auto index_tag) {
      using I = decltype(index_tag);
      loss_total_kernel<I, A><<<1, 1024, 0, cu::stream_for(dev)>>>(
          static_cast<const A*>(row_loss.data_ptr()), static_cast<const I*>(targets.data_ptr()),
          rows, ignore_index, static_cast<A*>(sum.data_ptr()),
          static_cast<int64_t*>(count.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  };
  if (row_loss.dtype() == DType::f64) {
    launch(double{});
  } else {
    check_dtype(row_loss, DType::f32, "classifier_total", "row_loss");
    launch(float{});
  }
}

void scale_by_seed(const Tensor& x, const Tensor& seed, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t n = out.numel();
  cu::visit_float_dtype(out.dtype(), "scale_by_seed", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    check_dtype(seed, std::is_same_v<A, double> ? DType::f64 : DType::f32, "scale_by_seed", "seed");
    auto launch = [&](auto x_tag) {
      using X = decltype(x_tag);
      scale_by_seed_kernel<X, T, A>
          <<<cu::grid_for(n, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const X*>(x.data_ptr()), static_cast<const A*>(seed.data_ptr()), n,
              static_cast<T*>(out.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    };
    if (x.dtype() == out.dtype()) {
      launch(T{});
    } else {
      check_dtype(x, DType::f32, "scale_by_seed", "x");
      launch(float{});
    }
  });
}

}  // namespace accrue::kernels::cuda
