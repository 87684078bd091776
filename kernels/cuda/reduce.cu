// CUDA row reductions: reduce_last (sum, mean, max, argmax over the last dim),
// sum_rows (column sums: the Linear bias gradient), softmax / log_softmax and
// their backward. No float atomics anywhere: see Note [Fixed reduction order].
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda_types.cuh"
#include "kernels/backend.h"
#include "kernels/cuda/elementwise_ops.cuh"

namespace accrue::kernels::cuda {
namespace {

// Note [Fixed reduction order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Determinism (Note [Determinism] in kernels/backend.h) means the order in
// which values are combined depends only on the shape and the launch
// configuration:
//  - a row segment is dealt to the threads of a group (a warp or a block) in
//    packs of V consecutive elements; pack c goes to thread c % nthreads, which
//    folds its packs in increasing c and a pack's elements in order. An
//    unaligned segment is read with scalar loads in the same pattern, so the
//    alignment of a view changes the loads, never the result;
//  - threads then combine through warp shuffles (a fixed butterfly) and, in a
//    block, through shared memory read in warp order;
//  - a long row (or, in sum_rows, a tall column) is split into a fixed number
//    of chunks whose partials go to a scratch tensor, and a second kernel folds
//    them in chunk order. The number of chunks comes from one wave of blocks
//    (SM count x resident blocks per SM of the compiled kernel): fixed for a
//    GPU model and a build.
// Nothing uses atomics, so the same input gives bitwise the same output.

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Rows up to this long get one warp each; longer rows get a block (or several).
constexpr int64_t kWarpRowMaxCols = 1024;
// The least work worth a block of its own when one row is split across blocks.
constexpr int64_t kMinChunk = 16384;
// sum_rows: the least number of rows a block sums before rows are split across blocks.
constexpr int64_t kMinRowsPerChunk = 64;

// ---- accumulators and group reductions -------------------------------------------------

template <class M>
struct ArgMaxAcc {
  M value;
  int64_t index;
};

// Online softmax state: the running maximum and the sum of exp(x - max).
template <class M>
struct SoftmaxAcc {
  M max;
  M sum;
};

__device__ __forceinline__ float shfl_xor(float v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ double shfl_xor(double v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ int64_t shfl_xor(int64_t v, int m) {
  return __shfl_xor_sync(kFullMask, static_cast<long long>(v), m);
}
template <class M>
__device__ __forceinline__ ArgMaxAcc<M> shfl_xor(ArgMaxAcc<M> a, int m) {
  return {shfl_xor(a.value, m), shfl_xor(a.index, m)};
}
template <class M>
__device__ __forceinline__ SoftmaxAcc<M> shfl_xor(SoftmaxAcc<M> a, int m) {
  return {shfl_xor(a.max, m), shfl_xor(a.sum, m)};
}

// Every lane ends with the combination of the 32 lanes' values (a butterfly:
// each step combines a pair of lanes, and R::combine is symmetric).
template <class R>
__device__ __forceinline__ typename R::A warp_allreduce(typename R::A v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = R::combine(v, shfl_xor(v, m));
  return v;
}

// Every thread of the block ends with the combination of all threads' values.
// smem holds one value per warp; the trailing barrier lets the caller reuse it.
template <class R>
__device__ __forceinline__ typename R::A block_allreduce(typename R::A v, typename R::A* smem) {
  v = warp_allreduce<R>(v);
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  typename R::A r = smem[0];
  const int warps = blockDim.x / 32;
  for (int w = 1; w < warps; ++w)
    r = R::combine(r, smem[w]);
  __syncthreads();
  return r;
}

template <class M>
__device__ __forceinline__ M negative_infinity() {
  return -std::numeric_limits<M>::infinity();
}

// ---- reducers: what reduce_last folds ---------------------------------------------------
//
// A reducer R has an accumulator type A, identity(), step(acc, index, x...) to
// fold one element (index: its column), a symmetric combine(a, b), and for
// reduce_last an output type Out with finalize(acc, cols, mean).

template <class T>
struct SumReducer {
  using M = dev::math_t<T>;
  using A = M;
  using Out = T;
  __device__ static A identity() { return A(0); }
  __device__ static A step(A acc, int64_t, T x) { return acc + dev::convert<M>(x); }
  __device__ static A combine(A a, A b) { return a + b; }
  __device__ static Out finalize(A acc, int64_t cols, bool mean) {
    return dev::convert<T>(mean ? acc / static_cast<A>(cols) : acc);
  }
};

// NaN wins: the maximum of a row holding a NaN is NaN.
template <class T>
struct MaxReducer {
  using M = dev::math_t<T>;
  using A = M;
  using Out = T;
  __device__ static A identity() { return negative_infinity<M>(); }
  __device__ static A combine(A a, A b) { return (a != a || a > b) ? a : b; }
  __device__ static A step(A acc, int64_t, T x) { return combine(acc, dev::convert<M>(x)); }
  __device__ static Out finalize(A acc, int64_t, bool) { return dev::convert<T>(acc); }
};

// The index of the first maximum; NaN counts as larger than any number (so the
// first NaN wins), which makes (value, index) a total order and combine symmetric.
template <class T>
struct ArgMaxReducer {
  using M = dev::math_t<T>;
  using A = ArgMaxAcc<M>;
  using Out = int64_t;
  __device__ static A identity() {
    return {negative_infinity<M>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ static A combine(A a, A b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.index <= b.index ? a : b;
  }
  __device__ static A step(A acc, int64_t index, T x) {
    return combine(acc, A{dev::convert<M>(x), index});
  }
  __device__ static Out finalize(A acc, int64_t, bool) { return acc.index; }
};

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

// ---- walking a row segment ------------------------------------------------------------------

template <class R, int V, class... T>
__device__ __forceinline__ typename R::A fold_pack(typename R::A acc, int64_t index,
                                                   const Pack<T, V>&... q) {
#pragma unroll
  for (int j = 0; j < V; ++j)
    acc = R::step(acc, index + j, q.v[j]...);
  return acc;
}

// Packs c, c + step, c + 2 step, c + 3 step of one operand; the first `valid`
// of them are loaded, together, so that their latencies overlap (a loop with a
// data-dependent exit would issue one load at a time).
template <class T, int V>
struct FourPacks {
  Pack<T, V> q[4];
};
template <int V, class T>
__device__ __forceinline__ FourPacks<T, V> load_four(const T* p, int64_t c, int64_t step,
                                                     int valid) {
  FourPacks<T, V> f;
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (u < valid) f.q[u] = load_pack<V>(p, c + u * step);
  return f;
}
template <class R, int V, class... T>
__device__ __forceinline__ typename R::A fold_four(typename R::A acc, int64_t index,
                                                   int64_t index_step, int valid,
                                                   const FourPacks<T, V>&... f) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (u < valid) acc = fold_pack<R, V>(acc, index + u * index_step, f.q[u]...);
  return acc;
}

// How many of c, c + step, c + 2 step, c + 3 step are below limit (c < limit).
__device__ __forceinline__ int valid_of_four(int64_t c, int64_t step, int64_t limit) {
  return static_cast<int>(std::min<int64_t>(4, (limit - c + step - 1) / step));
}

// Folds this thread's share of the `count` elements at p... (columns begin,
// begin + 1, ...) into acc, in the order of Note [Fixed reduction order].
template <class R, int V, class... T>
__device__ __forceinline__ typename R::A fold_segment(typename R::A acc, int64_t begin,
                                                      int64_t count, int t, int nthreads,
                                                      const T*... p) {
  const int64_t packs = count / V;
  if ((pack_aligned<V>(p) && ...)) {
    // Up to four of this thread's packs per step, folded in the same order as one at a time.
    for (int64_t c = t; c < packs; c += 4 * nthreads) {
      const int valid = valid_of_four(c, nthreads, packs);
      acc = fold_four<R, V>(acc, begin + c * V, nthreads * V, valid,
                            load_four<V>(p, c, nthreads, valid)...);
    }
  } else {
    for (int64_t c = t; c < packs; c += nthreads)
#pragma unroll
      for (int j = 0; j < V; ++j)
        acc = R::step(acc, begin + c * V + j, p[c * V + j]...);
  }
  // The partial last pack (number `packs`) is this thread's if the deal reaches it.
  if (t == packs % nthreads)
    for (int64_t e = packs * V; e < count; ++e)
      acc = R::step(acc, begin + e, p[e]...);
  return acc;
}

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

// The row a warp (kWarp) or a block works on, and the thread's place in that group.
template <bool kWarp>
struct RowGroup {
  int64_t row;
  int t;
  int nthreads;
  __device__ RowGroup() {
    if constexpr (kWarp) {
      row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
      t = threadIdx.x % 32;
      nthreads = 32;
    } else {
      row = blockIdx.x;
      t = threadIdx.x;
      nthreads = blockDim.x;
    }
  }
};

template <class R, bool kWarp>
__device__ __forceinline__ typename R::A group_allreduce(typename R::A v, typename R::A* smem) {
  if constexpr (kWarp) {
    return warp_allreduce<R>(v);
  } else {
    return block_allreduce<R>(v, smem);
  }
}

// ---- reduce_last ------------------------------------------------------------------------------

// One warp per row (kWarp, kWarps rows per block), or one block per row.
// Without partials a group finalizes its row into out; with partials (the split
// scheme) block (row, chunk) covers columns [chunk * chunk_len, ...) and stores
// its accumulator at partials[row * chunks + chunk].
template <class R, int V, bool kWarp, class T>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(const T* in, int64_t rows, int64_t cols, int64_t chunk_len, bool mean,
                       typename R::Out* out, typename R::A* partials) {
  __shared__ typename R::A smem[kWarps];
  const RowGroup<kWarp> g;
  if (kWarp && g.row >= rows) return;  // a whole warp leaves; warps never sync with each other
  const int64_t begin = kWarp ? 0 : blockIdx.y * chunk_len;
  const int64_t end = kWarp ? cols : std::min(cols, begin + chunk_len);
  typename R::A acc = fold_segment<R, V>(R::identity(), begin, end - begin, g.t, g.nthreads,
                                         in + g.row * cols + begin);
  acc = group_allreduce<R, kWarp>(acc, smem);
  if (g.t != 0) return;
  if (partials != nullptr) {
    partials[g.row * gridDim.y + blockIdx.y] = acc;
  } else {
    out[g.row] = R::finalize(acc, cols, mean);
  }
}

// The second pass of the split scheme: one block per row folds its chunks' partials in order.
template <class R>
__global__ void __launch_bounds__(kThreads)
    reduce_partials_kernel(const typename R::A* partials, int64_t chunks, int64_t cols, bool mean,
                           typename R::Out* out) {
  __shared__ typename R::A smem[kWarps];
  const int64_t row = blockIdx.x;
  typename R::A acc = R::identity();
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
    acc = R::combine(acc, partials[row * chunks + c]);
  acc = block_allreduce<R>(acc, smem);
  if (threadIdx.x == 0) out[row] = R::finalize(acc, cols, mean);
}

// Blocks of `threads` threads of `kernel` that the device runs at once.
int blocks_per_wave(const void* kernel, int threads, int device) {
  int sms = 0, per_sm = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  ACCRUE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::max(1, sms * per_sm);
}

// Temporary device memory of at least `bytes` bytes on `device` (freed, stream-ordered,
// when the returned tensor goes away).
Tensor scratch(int64_t bytes, Device device) {
  return empty({(bytes + 7) / 8}, DType::i64, device);
}

unsigned checked_grid(int64_t blocks, const char* op) {
  ACCRUE_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": ", blocks,
               " blocks exceed the CUDA grid limit");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

template <class R, class T>
void reduce_last_typed(const Tensor& in, const Tensor& out, bool mean) {
  using A = typename R::A;
  using Out = typename R::Out;
  constexpr int V = 16 / sizeof(T);
  // [rows, 0] has no columns to count rows by: the output has one element per row.
  const int64_t cols = in.dim() == 0 ? 1 : in.shape().back();
  const int64_t rows = cols == 0 ? out.numel() : in.numel() / cols;
  if (rows == 0) return;
  const int device = in.device().index;
  cudaStream_t stream = dev::stream_for(device);
  const T* x = static_cast<const T*>(in.data_ptr());
  Out* y = static_cast<Out*>(out.data_ptr());

  if (cols <= kWarpRowMaxCols) {
    reduce_rows_kernel<R, V, true, T>
        <<<checked_grid((rows + kWarps - 1) / kWarps, "reduce"), kThreads, 0, stream>>>(
            x, rows, cols, cols, mean, y, nullptr);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  // Long rows: one block per row, unless there are too few rows to fill the GPU;
  // then each row is split into chunks so that rows x chunks is about one wave.
  auto* kernel = reduce_rows_kernel<R, V, false, T>;
  int64_t chunks = 1;
  const int64_t max_chunks = (cols + kMinChunk - 1) / kMinChunk;
  if (max_chunks > 1) {
    const int64_t wave = blocks_per_wave(reinterpret_cast<const void*>(kernel), kThreads, device);
    if (rows < wave) chunks = std::min({max_chunks, wave / rows, int64_t{65535}});
  }
  // Chunks start at multiples of V, so an aligned row gives aligned chunks.
  int64_t chunk_len = (cols + chunks - 1) / chunks;
  chunk_len = (chunk_len + V - 1) / V * V;
  chunks = (cols + chunk_len - 1) / chunk_len;
  const dim3 grid(checked_grid(rows, "reduce"), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    kernel<<<grid, kThreads, 0, stream>>>(x, rows, cols, chunk_len, mean, y, nullptr);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  const Tensor partials = scratch(rows * chunks * static_cast<int64_t>(sizeof(A)), in.device());
  A* p = static_cast<A*>(partials.data_ptr());
  kernel<<<grid, kThreads, 0, stream>>>(x, rows, cols, chunk_len, mean, y, p);
  ACCRUE_LAUNCH_CHECK();
  reduce_partials_kernel<R><<<grid.x, kThreads, 0, stream>>>(p, chunks, cols, mean, y);
  ACCRUE_LAUNCH_CHECK();
}

// ---- sum_rows ----------------------------------------------------------------------------------

// Column sums of the contiguous [n, d] matrix `in`. Block (x, y) sums the
// columns of tile x (32 * V columns: thread tx owns V adjacent ones, read as one
// pack) over rows [y * rows_per_chunk, ...): thread row ty takes every TY-th
// row in order, then the TY partial sums of a column are added in ty order.
// The result goes to out[y * d + column]: the final output when gridDim.y == 1
// (added to it when accumulate), else the y-th row of the partials.
template <class Tin, class Tout, class A, int V, int TY>
__global__ void __launch_bounds__(32 * TY)
    sum_columns_kernel(const Tin* in, int64_t n, int64_t d, int64_t rows_per_chunk, Tout* out,
                       bool accumulate) {
  __shared__ A partial[TY][32 * V];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * 32 * V;
  const int64_t col = tile + tx * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min(n, r0 + rows_per_chunk);
  A acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j)
    acc[j] = A(0);
  if (col < d) {
    // Every row's pack is aligned when the base is and d is a multiple of V.
    if (d % V == 0 && pack_aligned<V>(in)) {
      const Tin* p = in + col;
      // Up to four rows' loads in flight before any is added (rows still added in order).
      for (int64_t r = r0 + ty; r < r1; r += 4 * TY) {
        const int valid = valid_of_four(r, TY, r1);
        const FourPacks<Tin, V> f = load_four<V>(p + r * d, 0, TY * d / V, valid);
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (u < valid)
#pragma unroll
            for (int j = 0; j < V; ++j)
              acc[j] += dev::convert<A>(f.q[u].v[j]);
      }
    } else {
      for (int64_t r = r0 + ty; r < r1; r += TY)
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (col + j < d) acc[j] += dev::convert<A>(in[r * d + col + j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j)
    partial[ty][tx * V + j] = acc[j];
  __syncthreads();
  for (int k = ty * 32 + tx; k < 32 * V; k += 32 * TY) {
    const int64_t c = tile + k;
    if (c >= d) break;
    A s = partial[0][k];
#pragma unroll
    for (int y = 1; y < TY; ++y)
      s += partial[y][k];
    Tout* o = out + static_cast<int64_t>(blockIdx.y) * d + c;
    if (accumulate) s = dev::convert<A>(*o) + s;
    *o = dev::convert<Tout>(s);
  }
}

template <class Tin, class Tout>
void sum_rows_typed(const Tensor& in, const Tensor& out, bool accumulate) {
  // Accumulate in fp32, or f64 when either side is f64.
  using A = std::conditional_t<std::is_same_v<Tin, double> || std::is_same_v<Tout, double>, double,
                               float>;
  constexpr int V = 16 / sizeof(Tin);
  constexpr int TY = 8;
  const int64_t n = in.size(0), d = in.size(1);
  const int device = in.device().index;
  cudaStream_t stream = dev::stream_for(device);
  const Tin* x = static_cast<const Tin*>(in.data_ptr());
  Tout* y = static_cast<Tout*>(out.data_ptr());
  const int64_t tiles = (d + 32 * V - 1) / (32 * V);
  const dim3 block(32, TY);
  // Split the rows into chunks when one pass over the column tiles would leave
  // most of the GPU idle (the usual case: d is a few thousand).
  auto* partial_kernel = sum_columns_kernel<Tin, A, A, V, TY>;
  int64_t chunks = 1;
  const int64_t max_chunks = (n + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  if (max_chunks > 1) {
    const int64_t wave =
        blocks_per_wave(reinterpret_cast<const void*>(partial_kernel), 32 * TY, device);
    chunks = std::clamp<int64_t>(wave / tiles, 1, std::min<int64_t>(max_chunks, 65535));
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  chunks = std::max<int64_t>(1, (n + rows_per_chunk - 1) / rows_per_chunk);
  if (chunks == 1) {
    sum_columns_kernel<Tin, Tout, A, V, TY>
        <<<dim3(checked_grid(tiles, "sum_rows"), 1), block, 0, stream>>>(x, n, d, rows_per_chunk, y,
                                                                         accumulate);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  const Tensor partials = scratch(chunks * d * static_cast<int64_t>(sizeof(A)), in.device());
  A* p = static_cast<A*>(partials.data_ptr());
  partial_kernel<<<dim3(checked_grid(tiles, "sum_rows"), static_cast<unsigned>(chunks)), block, 0,
                   stream>>>(x, n, d, rows_per_chunk, p, false);
  ACCRUE_LAUNCH_CHECK();
  // Second pass over the [chunks, d] partials: one column per thread, 32 threads per column.
  constexpr int kTY2 = 32;
  sum_columns_kernel<A, Tout, A, 1, kTY2>
      <<<dim3(checked_grid((d + 31) / 32, "sum_rows"), 1), dim3(32, kTY2), 0, stream>>>(
          p, chunks, d, chunks, y, accumulate);
  ACCRUE_LAUNCH_CHECK();
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

void reduce_last(ReduceOp op, const Tensor& in, const Tensor& out) {
  dev::DeviceScope scope(in.device().index);
  dev::visit_float_dtype(in.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::Sum:
        return reduce_last_typed<SumReducer<T>, T>(in, out, false);
      case ReduceOp::Mean:
        return reduce_last_typed<SumReducer<T>, T>(in, out, true);
      case ReduceOp::Max:
        return reduce_last_typed<MaxReducer<T>, T>(in, out, false);
      case ReduceOp::ArgMax:
        return reduce_last_typed<ArgMaxReducer<T>, T>(in, out, false);
    }
  });
}

void sum_rows(const Tensor& in, const Tensor& out, bool accumulate) {
  ACCRUE_CHECK(in.dim() == 2, "sum_rows: expected a 2-D input, got shape ", shape_str(in.shape()));
  // Dispatch allows the input's dtype or f32 (an arena slot) for out; only
  // those pairs are compiled.
  ACCRUE_CHECK(out.dtype() == in.dtype() || out.dtype() == DType::f32, "sum_rows: out dtype ",
               dtype_name(out.dtype()), " for input dtype ", dtype_name(in.dtype()));
  if (in.size(1) == 0) return;
  dev::DeviceScope scope(in.device().index);
  dev::visit_float_dtype(in.dtype(), "sum_rows", [&](auto tag) {
    using Tin = decltype(tag);
    if (out.dtype() == in.dtype()) {
      sum_rows_typed<Tin, Tin>(in, out, accumulate);
    } else {
      sum_rows_typed<Tin, float>(in, out, accumulate);
    }
  });
}

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
