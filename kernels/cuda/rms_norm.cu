// CUDA RMSNorm, forward and backward, and the residual add fused with it
// (kernels/fused.h). 16-bit inputs compute in f32, f64 in f64; every
// reduction runs in a fixed order (Note [Determinism]).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/column_sums.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"
#include "accrue/kernels/fused_backend.h"

namespace accrue::kernels::cuda {

namespace {

using namespace reduce;  // warp_sum, block_sum, sqrt_, load
using cu::load_pack;
using cu::Pack;
using cu::store_pack;

// Note [RMSNorm kernels]
// ~~~~~~~~~~~~~~~~~~~~~~
// A row is read in packs of V elements (16 bytes when D and every row
// pointer allow it, else V = 1) by a group of threads: kLanes lanes of a warp
// per row for rows of at most kWarpRowPacks packs (per-head qk_norm, small
// models: 256-thread blocks keep the SM full), else one block per row (about
// two packs per thread). A row of fewer than 32 packs takes the smallest
// power of two of lanes, at least 8, that holds it (a head of 128 bf16: 16
// lanes, two rows a warp), so few lanes idle; every lane then holds at most one pack, as it
// would in a whole warp, whose other lanes would add zeros: the sums are
// bitwise those of a warp per row. Lanes of a row past the last still take
// part in the warp's shuffles. The group sums the squares (of the rounded
// sum, for add_rms_norm), then re-reads the row it has just read or written
// (from the cache) to scale it: each thread re-reads only its own packs, so
// no barrier is needed beyond the reduction's. The backward's dx has the same
// shape; dweight is a column sum over rows in the fixed chunks of Note
// [Deterministic column sums].
constexpr int kWarpRowPacks = 128;
constexpr int kWarpRowThreads = 256;  // a block of warp-row groups

// kLanes: lanes of a warp per row (1 .. 32, a power of two), or 0 for a block per row.
template <int kLanes, class M>
__device__ __forceinline__ M group_sum(M v, M* scratch) {
  if constexpr (kLanes == 0) {
    return block_sum(v, scratch);
  } else {
    for (int offset = kLanes / 2; offset > 0; offset >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
}

// The row this thread's group handles, its lane within the group and the
// group's size.
template <int kLanes>
__device__ __forceinline__ void group_of(int64_t* row, int* lane, int* size) {
  if constexpr (kLanes > 0) {
    *row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kLanes) + threadIdx.x / kLanes;
    *lane = static_cast<int>(threadIdx.x % kLanes);
    *size = kLanes;
  } else {
    *row = blockIdx.x;
    *lane = static_cast<int>(threadIdx.x);
    *size = static_cast<int>(blockDim.x);
  }
}

// Where row r of x starts: (r / inner) * outer_stride + (r % inner) *
// inner_stride (a [O, I, D] view: a per-head q of a packed qkv; a dense x is
// inner = rows, inner_stride = D).
struct RowGeometry {
  int64_t inner, outer_stride, inner_stride;
  __device__ __forceinline__ int64_t offset(int64_t r) const {
    return (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

// out = x * rstd * weight over one row per group; with kResidual, x + residual
// is first stored (rounded to T) into sum and normalized from there.
template <class T, class P, int V, int kLanes, bool kResidual>
__global__ void rms_norm_kernel(const T* __restrict__ x, RowGeometry xg,
                                const T* __restrict__ residual, const P* __restrict__ weight,
                                int64_t rows, int64_t d, cu::math_t<T> eps, T* sum,
                                T* __restrict__ out, cu::math_t<T>* __restrict__ rstd) {
  using M = cu::math_t<T>;
  __shared__ M scratch[32];
  int64_t row;
  int lane, size;
  group_of<kLanes>(&row, &lane, &size);
  // Past the last row (warp rows only: blocks cover rows exactly): the lanes
  // read and write nothing but join the shuffles.
  const bool real = row < rows;
  if (!real) row = 0;
  const int64_t packs = real ? d / V : 0;
  const T* xr = x + xg.offset(row);
  const T* src = kResidual ? sum + row * d : xr;
  T* yr = out + row * d;

  M ss = 0;
  for (int64_t k = lane; k < packs; k += size) {
    Pack<T, V> a = load_pack<V>(xr, k);
    if constexpr (kResidual) {
      const Pack<T, V> b = load_pack<V>(residual + row * d, k);
#pragma unroll
      for (int j = 0; j < V; ++j)
        a.v[j] = cu::convert<T>(load<M>(a.v[j]) + load<M>(b.v[j]));
      store_pack<V>(sum + row * d, k, a);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M v = load<M>(a.v[j]);
      ss += v * v;
    }
  }
  const M rs = M(1) / sqrt_(group_sum<kLanes>(ss, scratch) / static_cast<M>(d) + eps);

  for (int64_t k = lane; k < packs; k += size) {
    const Pack<T, V> a = load_pack<V>(src, k);
    Pack<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      M value = load<M>(a.v[j]) * rs;
      if (weight) value *= load<M>(weight[k * V + j]);
      y.v[j] = cu::convert<T>(value);
    }
    store_pack<V>(yr, k, y);
  }
  if (lane == 0 && real) rstd[row] = rs;
}

// Calls f(k, j) for the packs k of a row that lane `lane` of a group of
// `size` owns, j counting them: k = lane + j * size. kMaxPacks > 0 bounds j at
// compile time (so per-pack state can live in registers), 0 leaves it open.
template <int kMaxPacks, class F>
__device__ __forceinline__ void for_packs(int lane, int size, int64_t packs, F&& f) {
  if constexpr (kMaxPacks == 0) {
    for (int64_t k = lane; k < packs; k += size)
      f(k, 0);
  } else {
#pragma unroll
    for (int j = 0; j < kMaxPacks; ++j) {
      const int64_t k = lane + static_cast<int64_t>(j) * size;
      if (k < packs) f(k, j);
    }
  }
}

// dx = rstd * (gw - xhat * mean(gw * xhat)) with xhat = x * rstd, gw = dy * w,
// plus add where there is one (rounded once),
// over the rows group, group + groups, ... of each group (Note [RMSNorm
// backward]). With kMaxPacks > 0 the group also sums dy * xhat of the columns
// it owns over its rows, in row order, and the block's groups write their sum
// to partial[block].
// (Keeping the row's packs and the weights in registers between the two
// passes, instead of re-reading them from the cache, measured 0.312 ms
// against 0.212 on an H200 at 16384 x 4096 bf16: the registers cost
// occupancy.)
template <class T, class P, int V, int kLanes, int kMaxPacks>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         RowGeometry xg, const P* __restrict__ weight,
                                         const cu::math_t<T>* __restrict__ rstd, int64_t rows,
                                         int64_t d, int64_t groups, const T* __restrict__ add,
                                         T* __restrict__ dx, cu::math_t<T>* __restrict__ partial) {
  using M = cu::math_t<T>;
  constexpr int kAcc = kMaxPacks > 0 ? kMaxPacks : 1;
  __shared__ M scratch[32];
  int64_t group;
  int lane, size;
  group_of<kLanes>(&group, &lane, &size);
  const bool real_group = group < groups;
  const int64_t packs = real_group ? d / V : 0;
  M acc[kAcc][V];
#pragma unroll
  for (int j = 0; j < kAcc; ++j)
#pragma unroll
    for (int v = 0; v < V; ++v)
      acc[j][v] = 0;
  // Every lane of a warp runs the same number of iterations (a group past the
  // last, or past its last row, reads and writes nothing): the warp's shuffles
  // need them all.
  const int64_t iterations =
      kLanes > 0 ? (rows + groups - 1) / groups : (rows - group + groups - 1) / groups;
  for (int64_t i = 0; i < iterations; ++i) {
    const int64_t row = group + i * groups;
    const bool real = real_group && row < rows;
    const int64_t row_packs = real ? packs : 0;
    const T* xr = x + (real ? xg.offset(row) : 0);
    const T* gr = dy + (real ? row * d : 0);
    const M rs = real ? rstd[row] : M(0);
    M s = 0;
    for_packs<kMaxPacks>(lane, size, row_packs, [&](int64_t k, int) {
      const Pack<T, V> a = load_pack<V>(xr, k), g = load_pack<V>(gr, k);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        M gw = load<M>(g.v[j]);
        if (weight) gw *= load<M>(weight[k * V + j]);
        s += gw * load<M>(a.v[j]);
      }
    });
    // mean(gw * xhat) = rstd * sum(gw * x) / d.
    const M mean_gw_xhat = group_sum<kLanes>(s, scratch) * rs / static_cast<M>(d);
    for_packs<kMaxPacks>(lane, size, row_packs, [&](int64_t k, int jj) {
      const Pack<T, V> a = load_pack<V>(xr, k), g = load_pack<V>(gr, k);
      Pack<T, V> out, plus;
      if (add) plus = load_pack<V>(add + row * d, k);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const M gv = load<M>(g.v[j]), xhat = load<M>(a.v[j]) * rs;
        const M gw = weight ? gv * load<M>(weight[k * V + j]) : gv;
        const M v = rs * (gw - xhat * mean_gw_xhat);
        out.v[j] = cu::convert<T>(add ? v + load<M>(plus.v[j]) : v);
        if constexpr (kMaxPacks > 0) acc[jj][j] += gv * xhat;
      }
      store_pack<V>(dx + row * d, k, out);
    });
  }
  if constexpr (kMaxPacks > 0 && kLanes == 0) {  // the block is the group
    for_packs<kMaxPacks>(lane, size, packs, [&](int64_t k, int jj) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        partial[blockIdx.x * d + k * V + j] = acc[jj][j];
    });
  } else if constexpr (kMaxPacks > 0) {
    // Note [RMSNorm backward]: one partial row per block. Lane l of every
    // group of a warp owns the same columns: a butterfly over the groups
    // (bitwise the same sum on each lane), then each warp's sums to shared
    // memory and, after one barrier, the warps' sums added in warp order.
#pragma unroll
    for (int jj = 0; jj < kMaxPacks; ++jj)
#pragma unroll
      for (int j = 0; j < V; ++j)
        for (int offset = kLanes; offset < 32; offset <<= 1)
          acc[jj][j] += __shfl_xor_sync(0xffffffffu, acc[jj][j], offset);
    constexpr int kWarps = kWarpRowThreads / 32;     // the launch's block of warp-row groups
    __shared__ M column[kWarps][kLanes * kAcc * V];  // d <= kLanes * kMaxPacks * V
    const int warp = static_cast<int>(threadIdx.x / 32);
    if (static_cast<int>(threadIdx.x % 32) < kLanes) {
      for_packs<kMaxPacks>(lane, kLanes, d / V, [&](int64_t k, int jj) {
#pragma unroll
        for (int j = 0; j < V; ++j)
          column[warp][k * V + j] = acc[jj][j];
      });
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      M sum = column[0][c];
      for (int w = 1; w < kWarps; ++w)
        sum += column[w][c];
      partial[blockIdx.x * d + c] = sum;
    }
  }
}

// Note [Deterministic column sums] (kernels/cuda/column_sums.cuh): block
// (x, y) sums 32 columns of dy * x * rstd over one chunk of rows, each thread
// a fixed stride of the chunk, then the 8 thread rows in order.
template <class T, class A>
__global__ void rms_norm_weight_partials_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                RowGeometry xg, const A* __restrict__ rstd,
                                                int64_t rows, int64_t d, int64_t rows_per_chunk,
                                                A* __restrict__ partial) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = std::min(rows, begin + rows_per_chunk);
  A acc = 0;
  if (c < d) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes)
      acc += load<A>(dy[r * d + c]) * (load<A>(x[xg.offset(r) + c]) * rstd[r]);
  }
  acc = column_tile_total(acc);
  if (threadIdx.y == 0 && c < d) partial[blockIdx.y * d + c] = acc;
}

bool aligned_16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

template <class P>
const P* optional_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.data_ptr()) : nullptr;
}

// Threads for one block-per-row group of `packs` packs: about two packs per
// thread, a whole number of warps, between one warp and 512 threads.
int block_row_threads(int64_t packs) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{2} < packs)
    threads *= 2;
  return threads;
}

// Launches f(P{}, V, kLanes, grid, block) for x's element type T: the
// parameter type (f32 master weights beside 16-bit x, else T), the pack width
// and the group shape of Note [RMSNorm kernels] (kLanes 0: a block per row;
// grid: one group per row).
template <class T, class F>
void launch_rows(int64_t rows, int64_t d, bool f32_params, bool vectorized, const char* op, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  auto with_vec = [&](auto param_tag, auto vec) {
    constexpr int V = decltype(vec)::value;
    const int64_t packs = d / V;
    auto warp_rows = [&](auto lanes) {
      constexpr int kRowsPerBlock = kWarpRowThreads / decltype(lanes)::value;
      const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
      check_grid_x(blocks, op);
      f(param_tag, vec, lanes, static_cast<unsigned>(blocks), kWarpRowThreads);
    };
    // (Fewer lanes than 8 for tiny rows would add instantiations for shapes
    // that are not worth them.)
    if (packs <= 8) {
      warp_rows(std::integral_constant<int, 8>{});
    } else if (packs <= 16) {
      warp_rows(std::integral_constant<int, 16>{});
    } else if (packs <= kWarpRowPacks) {
      warp_rows(std::integral_constant<int, 32>{});
    } else {
      check_grid_x(rows, op);
      f(param_tag, vec, std::integral_constant<int, 0>{}, static_cast<unsigned>(rows),
        block_row_threads(packs));
    }
  };
  auto with_params = [&](auto vec) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
      if (f32_params) return with_vec(float{}, vec);
    }
    return with_vec(T{}, vec);
  };
  if (vectorized && d % kVec == 0) {
    with_params(std::integral_constant<int, kVec>{});
  } else {
    with_params(std::integral_constant<int, 1>{});
  }
}

// x's rows: a [O, I, D] view (rms_norm's input) or a dense [rows, D].
RowGeometry geometry_of(const Tensor& x) {
  if (x.dim() == 3) return RowGeometry{x.size(1), x.stride(0), x.stride(1)};
  return RowGeometry{x.size(0), 0, x.size(1)};
}

// Every row of x starts 16-byte aligned (with the base pointer aligned).
bool rows_aligned(const Tensor& x, const RowGeometry& g) {
  const int64_t vec = 16 / static_cast<int64_t>(element_size(x.dtype()));
  return aligned_16(x) && g.outer_stride % vec == 0 && g.inner_stride % vec == 0;
}

// The forward of rms_norm (x [O, I, D], residual undefined) and add_rms_norm
// (x and residual dense [rows, D]).
void rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight_in, double eps,
                      const Tensor& sum, const Tensor& out, const Tensor& rstd, const char* op) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = out.size(0), d = out.size(1);
  if (rows == 0) return;
  const bool f32_params = weight_in.defined() && weight_in.dtype() == DType::f32;
  const Tensor weight = as_dtype(weight_in, f32_params ? DType::f32 : x.dtype());
  const bool residual_add = residual.defined();
  const RowGeometry xg = geometry_of(x);
  const bool vectorized = rows_aligned(x, xg) && aligned_16(out) &&
                          (!residual_add || (aligned_16(residual) && aligned_16(sum)));
  cudaStream_t stream = cu::stream_for(dev);
  cu::visit_float_dtype(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using M = cu::math_t<T>;
    launch_rows<T>(rows, d, f32_params, vectorized, op,
                   [&](auto param_tag, auto vec, auto lanes, unsigned grid, int threads) {
                     using P = decltype(param_tag);
                     constexpr int V = decltype(vec)::value;
                     constexpr int L = decltype(lanes)::value;
                     auto kernel = residual_add ? rms_norm_kernel<T, P, V, L, true>
                                                : rms_norm_kernel<T, P, V, L, false>;
                     kernel<<<grid, threads, 0, stream>>>(
                         static_cast<const T*>(x.data_ptr()), xg,
                         residual_add ? static_cast<const T*>(residual.data_ptr()) : nullptr,
                         optional_ptr<P>(weight), rows, d, static_cast<M>(eps),
                         residual_add ? static_cast<T*>(sum.data_ptr()) : nullptr,
                         static_cast<T*>(out.data_ptr()), static_cast<M*>(rstd.data_ptr()));
                     ACCRUE_LAUNCH_CHECK();
                   });
  });
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
              const Tensor& rstd) {
  rms_norm_forward(x, Tensor(), weight, eps, Tensor(), out, rstd, "rms_norm");
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                  const Tensor& sum, const Tensor& out, const Tensor& rstd) {
  rms_norm_forward(x, residual, weight, eps, sum, out, rstd, "add_rms_norm");
}

// Note [RMSNorm backward]
// ~~~~~~~~~~~~~~~~~~~~~~~
// dx has the forward's shape (Note [RMSNorm kernels]), but a fixed number of
// groups (blocks, or the kLanes-lane groups of 256-thread blocks) take the rows in turn: group g
// the rows g, g + groups, ... . Where a thread owns at most kFusedPacks packs
// of a row, it also sums dy * xhat of its columns over its rows in registers,
// so dy and x are read once for both gradients (three tensors' traffic in
// all); each block adds its groups' column sums into one partial row, in a
// fixed order (a warp's groups by a butterfly, then the warps in turn), and
// a second kernel adds the partial rows in order (Note [Deterministic column
// sums]). (A partial row per group wrote 8,192 f32 rows at 16,384 x 768
// bf16, a third of dy, x and dx's traffic; a row per block writes 1,024. The
// time did not change, 0.30 of the copy rate on an H200 either way: that
// traffic is not what bounds that width.)
// The sums sit in registers sized at compile time to the packs a thread
// owns: 2, 3 or kFusedPacks (4096-wide bf16 rows: 2 packs a thread; 768-wide
// ones in warp groups: 3). Sized for 4 at 4096, the kernel took 79 registers
// a thread, 3 blocks an SM (37.5% occupancy, 33% achieved) and ran at 0.60
// of the DRAM peak (ncu, H100, 16384 x 4096 bf16; most stalls waiting on
// loads); sized for 2, 48 registers and 0.73 of the copy rate. The warp
// groups' column sums went through one shared row, a barrier per warp in
// turn: 30% of the stalls at 768 wide (ncu, H100). Each warp now writes its
// own row and one barrier precedes the sum in warp order (the same
// additions in the same order).
// Wider rows run the dx pass alone and the column sums over 64-row chunks of
// dy and x, a second read. The group count depends only on the shape, so the
// sums do too. Warp groups: 4,096 (4 rows a warp at 16,384 rows, 512 blocks,
// one wave) ran at 0.47 of the copy rate at 16384 x 768 bf16 on an H200,
// against 0.43 with 8,192, 0.43 with 2,048 and 0.39 with 16,384 (two
// alternated rounds each, 2026-11-28).
constexpr int kFusedPacks = 4;
constexpr int64_t kBlockGroups = 1024;  // about eight 256-thread blocks per SM of an H100
constexpr int64_t kWarpGroups = 4096;

void rms_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight_in,
                                const Tensor& rstd, const Tensor& dx, const Tensor& dx_add,
                                bool want_dweight, NormPartials* partials) {
  const char* op = "rms_norm_backward";
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t rows = dx.size(0), d = dx.size(1);
  if (rows == 0) return;
  const bool f32_params = weight_in.defined() && weight_in.dtype() == DType::f32;
  const Tensor weight = as_dtype(weight_in, f32_params ? DType::f32 : x.dtype());
  const RowGeometry xg = geometry_of(x);
  const bool vectorized = aligned_16(grad) && rows_aligned(x, xg) && aligned_16(dx) &&
                          (!dx_add.defined() || aligned_16(dx_add));
  const DType acc_dtype = accumulate_dtype(x.dtype());
  const Device device = Device::cuda(dev);
  cu::visit_float_dtype(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    Tensor partial;  // [chunks, d]: column sums of dy * xhat per group or chunk
    int64_t chunks = 0;
    launch_rows<T>(rows, d, f32_params, vectorized, op,
                   [&](auto param_tag, auto vec, auto lanes, unsigned, int threads) {
                     using P = decltype(param_tag);
                     constexpr int V = decltype(vec)::value;
                     constexpr int L = decltype(lanes)::value;
                     const int64_t packs = d / V;
                     const int64_t size = L > 0 ? L : threads;
                     const int64_t per_thread = (packs + size - 1) / size;
                     const bool fused = want_dweight && per_thread <= kFusedPacks;
                     const int64_t groups = std::min(rows, L > 0 ? kWarpGroups : kBlockGroups);
                     const int64_t rows_per_block = L > 0 ? threads / L : 1;
                     const int64_t blocks = (groups + rows_per_block - 1) / rows_per_block;
                     auto args = [&](auto kernel, A* partial_ptr) {
                       kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
                           static_cast<const T*>(grad.data_ptr()),
                           static_cast<const T*>(x.data_ptr()), xg, optional_ptr<P>(weight),
                           static_cast<const A*>(rstd.data_ptr()), rows, d, groups,
                           optional_ptr<T>(dx_add), static_cast<T*>(dx.data_ptr()), partial_ptr);
                       ACCRUE_LAUNCH_CHECK();
                     };
                     if (fused) {
                       chunks = blocks;  // a partial row per block
                       partial = empty({chunks, d}, acc_dtype, device);
                       // Note [RMSNorm backward]: the column sums' registers
                       // sized to the packs a thread owns.
                       auto* partial_ptr = static_cast<A*>(partial.data_ptr());
                       if (per_thread <= 2) {
                         args(rms_norm_backward_kernel<T, P, V, L, 2>, partial_ptr);
                       } else if (per_thread == 3) {
                         args(rms_norm_backward_kernel<T, P, V, L, 3>, partial_ptr);
                       } else {
                         args(rms_norm_backward_kernel<T, P, V, L, kFusedPacks>, partial_ptr);
                       }
                     } else {
                       args(rms_norm_backward_kernel<T, P, V, L, 0>, nullptr);
                     }
                   });
    if (!want_dweight) return;
    const unsigned column_blocks = static_cast<unsigned>((d + kColumnTile - 1) / kColumnTile);
    if (!partial.defined()) {
      // Note [Deterministic column sums]: about 64 rows per chunk, at most 1024 chunks.
      chunks = std::min<int64_t>((rows + 63) / 64, 1024);
      const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
      partial = empty({chunks, d}, acc_dtype, device);
      rms_norm_weight_partials_kernel<T, A>
          <<<dim3(column_blocks, static_cast<unsigned>(chunks)), dim3(kColumnTile, kRowLanes), 0,
             stream>>>(static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
                       xg, static_cast<const A*>(rstd.data_ptr()), rows, d, rows_per_chunk,
                       static_cast<A*>(partial.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    }
    // dweight's totals: norm_param_totals (kernels/cuda/layer_norm.cu).
    partials->dweight = partial;
    partials->chunks = chunks;
  });
}

}  // namespace accrue::kernels::cuda
