// Device helpers shared by the CUDA row kernels: reduce_last
// (kernels/cuda/reduce.cu), sum_rows (kernels/cuda/sum_rows.cu) and softmax
// (kernels/cuda/softmax.cu): a row segment dealt to a warp or a block in
// packs, folded by a reducer and combined through warp shuffles, in the order
// of Note [Fixed reduction order]. No float atomics anywhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/core/tensor.h"
#include "accrue/kernels/cuda/elementwise_ops.cuh"

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
//    GPU model and a build. (sum_rows of up to 4,096 rows on Hopper folds
//    its chunks in one kernel instead, in the same order, with the chunks
//    from the shape alone: Note [Column sums in one cluster].)
// Nothing uses atomics, so the same input gives bitwise the same output.

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Rows up to this long get one warp each; longer rows get a block (or several).
constexpr int64_t kWarpRowMaxCols = 1024;

// ---- accumulators and group reductions -------------------------------------------------

__device__ __forceinline__ float shfl_xor(float v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ double shfl_xor(double v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ int64_t shfl_xor(int64_t v, int m) {
  return __shfl_xor_sync(kFullMask, static_cast<long long>(v), m);
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

// ---- reducers -----------------------------------------------------------------------------
//
// A reducer R has an accumulator type A, identity(), step(acc, index, x...) to
// fold one element (index: its column), a symmetric combine(a, b), and for
// reduce_last an output type Out with finalize(acc, cols, mean).

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

// Blocks of `threads` threads of `kernel` that the device runs at once.
inline int blocks_per_wave(const void* kernel, int threads, int device) {
  int sms = 0, per_sm = 0;
  ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  ACCRUE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::max(1, sms * per_sm);
}

// Temporary device memory of at least `bytes` bytes on `device` (freed, stream-ordered,
// when the returned tensor goes away).
inline Tensor scratch(int64_t bytes, Device device) {
  return empty({(bytes + 7) / 8}, DType::i64, device);
}

inline unsigned checked_grid(int64_t blocks, const char* op) {
  ACCRUE_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": ", blocks,
               " blocks exceed the CUDA grid limit");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

}  // namespace
}  // namespace accrue::kernels::cuda
