// CUDA sum_rows: the column sums of a [n, d] matrix (the Linear bias
// gradient), in the order of Note [Fixed reduction order]
// (kernels/cuda/row_reduce.cuh).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <cooperative_groups.h>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/row_reduce.cuh"

namespace accrue::kernels::cuda {
namespace {

// sum_rows: the least number of rows a block sums before rows are split across blocks.
constexpr int64_t kMinRowsPerChunk = 64;

// Column sums of the contiguous [n, d] matrix `in`, one block's share: the
// columns of tile blockIdx.x (L * V columns: thread tx of L lanes owns V
// adjacent ones, read as one pack) over rows [r0, r1): thread row ty takes
// every TY-th row in order, then the TY partial sums of a column are added in
// ty order. Column k of the tile calls `emit(k, sum)` once, on one thread.
template <class Tin, class A, int V, int TY, int L, class Emit>
__device__ __forceinline__ void column_tile_sums(const Tin* in, int64_t r0, int64_t r1, int64_t d,
                                                 A (&partial)[TY][L * V], Emit emit) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * L * V;
  const int64_t col = tile + tx * V;
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
  for (int k = ty * L + tx; k < L * V; k += L * TY) {
    if (tile + k >= d) break;
    A s = partial[0][k];
#pragma unroll
    for (int y = 1; y < TY; ++y)
      s += partial[y][k];
    emit(k, s);
  }
}

// Block (x, y) sums tile x over rows [y * rows_per_chunk, ...) (column_tile_sums).
// The result goes to out[y * d + column]: the final output when gridDim.y == 1
// (added to it when accumulate), else the y-th row of the partials.
template <class Tin, class Tout, class A, int V, int TY>
__global__ void __launch_bounds__(32 * TY)
    sum_columns_kernel(const Tin* in, int64_t n, int64_t d, int64_t rows_per_chunk, Tout* out,
                       bool accumulate) {
  __shared__ A partial[TY][32 * V];
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * 32 * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  column_tile_sums<Tin, A, V, TY, 32>(
      in, r0, std::min(n, r0 + rows_per_chunk), d, partial, [&](int k, A s) {
        Tout* o = out + static_cast<int64_t>(blockIdx.y) * d + tile + k;
        if (accumulate) s = dev::convert<A>(*o) + s;
        *o = dev::convert<Tout>(s);
      });
}

// Note [Column sums in one cluster]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At a micro-batch of one to four GPT-2 sequences (1,024 to 4,096 rows) a
// Linear's bias gradient reads 1.5 to 25 MB, and both kernels of the two-pass
// sum (chunk partials, then the partials in chunk order) are bound by
// latency, not bandwidth: at GPT-2 124M 1 x 32 on an H200, 3.1 us and 2.8 us
// a sum, 9.1 ms of a 108 ms window over 1,536 sums (bench/RESULTS.md,
// eleventh session). On compute capability 9.0 and up, up to
// kMaxClusterChunks chunks of a column tile run as the blocks of one
// thread-block cluster instead: each block leaves its chunk's sums in shared
// memory, and after a cluster barrier the cluster's first block adds them in
// chunk order through distributed shared memory and writes (=) or adds (+=)
// the total; a second barrier keeps the other blocks' shared memory alive
// until it has read them. One kernel, no scratch, no atomics: the order
// depends on the shape alone (the chunks are min(16, n / 64), not a count
// from the SM count as in the two-pass sum), so the same input gives the same
// bits on every run (Note [Determinism]). Where the cluster cannot be placed
// (an older GPU, or no GPC with room for it) the two-pass sum runs.
// A block's threads are L lanes of 256 / L rows, its tile L packs wide: at
// 4,096 x 768 (GPT-2's 768-wide biases at micro-batch 4) 32 lanes make 3
// tiles x 16 chunks, 48 blocks for 132 SMs. So the lanes are the most of 32,
// 16 and 8 that give at least 256 blocks, else 8 (cluster_lanes). The lanes
// follow from the shape alone, and so does the order of the additions.
// Forced widths on an H200, us (bench/RESULTS.md, twentieth session): 4,096 x
// 768 8.0 / 6.5 / 5.9 at 32 / 16 / 8 lanes, 4,096 x 2,304 9.1 / 8.1 / 9.5,
// 1,024 x 2,304 6.2 / 5.9 / 7.5.
// With the rule (twenty-second session) GPT-2's four bias sums a layer at
// 4,096 rows take 28.5 us instead of 34.5, and GPT-2 124M runs 0.9% faster
// at 4 x 8 and 0.5% at 1 x 32. ACCRUE_SUM_ROWS_LANES=32, 16 or 8 forces a
// width, for such side-by-side timings.
constexpr int kMaxClusterChunks = 16;
// The cluster path takes up to this many rows: beyond, a chunk of 16 would
// hold over 256 rows and the two passes spread the reads over more blocks.
constexpr int64_t kMaxClusterRows = kMaxClusterChunks * 256;
// Each cluster block's threads: L lanes (32, 16 or 8) of kClusterThreads / L rows.
constexpr int kClusterThreads = 256;
// The lanes are the most that still give this many blocks (tiles x chunks).
constexpr int64_t kClusterBlocksWanted = 256;

template <class Tin, class Tout, class A, int V, int L>
__global__ void __launch_bounds__(kClusterThreads)
    sum_columns_cluster_kernel(const Tin* in, int64_t n, int64_t d, int64_t rows_per_chunk,
                               Tout* out, bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int TY = kClusterThreads / L;
  __shared__ A partial[TY][L * V];
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * L * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  // The chunk's sums land in partial[0] (each column's thread rewrites only its own column).
  column_tile_sums<Tin, A, V, TY, L>(in, r0, std::min(n, r0 + rows_per_chunk), d, partial,
                                     [&](int k, A s) { partial[0][k] = s; });
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (cluster.block_rank() == 0) {
    const int chunks = static_cast<int>(cluster.num_blocks());
    for (int k = threadIdx.y * L + threadIdx.x; k < L * V; k += kClusterThreads) {
      if (tile + k >= d) break;
      A got[kMaxClusterChunks];
#pragma unroll
      for (int c = 0; c < kMaxClusterChunks; ++c)
        if (c < chunks) got[c] = cluster.map_shared_rank(&partial[0][k], c)[0];
      A s = got[0];
#pragma unroll
      for (int c = 1; c < kMaxClusterChunks; ++c)
        if (c < chunks) s += got[c];
      Tout* o = out + tile + k;
      if (accumulate) s = dev::convert<A>(*o) + s;
      *o = dev::convert<Tout>(s);
    }
  }
  cluster.sync();
#endif
}

// The launch of `tiles` x `chunks` blocks, each column of `chunks` blocks one cluster.
struct ClusterLaunch {
  cudaLaunchAttribute attribute = {};
  cudaLaunchConfig_t config = {};
  ClusterLaunch(unsigned tiles, dim3 block, int chunks, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = static_cast<unsigned>(chunks);
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(tiles, static_cast<unsigned>(chunks));
    config.blockDim = block;
    config.stream = stream;
    config.attrs = &attribute;  // so never copied
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether `chunks` blocks of the cluster kernel fit one cluster on `device`
// (compute capability 9.0+, and a GPC with room for them), asked once per
// kernel, device and cluster size. The kernels of different lane counts share
// a type, so L keys the cache too: each must get its own attribute set.
template <int L, class Kernel>
bool cluster_fits(Kernel* kernel, int device, int chunks, dim3 block) {
  constexpr int kDevices = 64;
  // 0 unknown, 1 yes, -1 no; any thread may ask first, and all find the same answer.
  static std::atomic<int8_t> known[kDevices][kMaxClusterChunks + 1] = {};
  if (device < 0 || device >= kDevices || chunks < 2 || chunks > kMaxClusterChunks) return false;
  std::atomic<int8_t>& k = known[device][chunks];
  if (k.load(std::memory_order_relaxed) == 0) {
    int major = 0;
    ACCRUE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    bool fits = false;
    if (major >= 9) {
      // Clusters of more than 8 blocks are "non-portable": allowed per kernel.
      ACCRUE_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      const ClusterLaunch one(1, block, chunks, nullptr);
      int clusters = 0;
      ACCRUE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &one.config));
      fits = clusters > 0;
    }
    k.store(fits ? 1 : -1, std::memory_order_relaxed);
  }
  return k.load(std::memory_order_relaxed) > 0;
}

// Note [Column sums in one cluster]: the lanes of a cluster block, 32, 16 or
// 8. ACCRUE_SUM_ROWS_LANES overrides, for a side-by-side timing; it is read at
// every call (a graph replay makes none), so a test can set it.
int cluster_lanes(int64_t d, int v, int64_t chunks) {
  if (const char* env = std::getenv("ACCRUE_SUM_ROWS_LANES"); env != nullptr && *env != '\0') {
    const std::string forced(env);
    if (forced == "32" || forced == "16" || forced == "8") return std::stoi(forced);
    ACCRUE_FAIL("sum_rows: ACCRUE_SUM_ROWS_LANES must be 32, 16 or 8, got '", forced, "'");
  }
  for (int lanes : {32, 16}) {
    const int64_t tiles = (d + lanes * v - 1) / (lanes * v);
    if (tiles * chunks >= kClusterBlocksWanted) return lanes;
  }
  return 8;
}

// The sum as one cluster of `chunks` blocks per column tile of L * V columns;
// false where the cluster cannot be placed.
template <class Tin, class Tout, class A, int V, int L>
bool sum_in_cluster(const Tensor& in, const Tensor& out, int64_t chunks, bool accumulate) {
  const int64_t n = in.size(0), d = in.size(1);
  const int device = in.device().index;
  const dim3 block(L, kClusterThreads / L);
  auto* kernel = sum_columns_cluster_kernel<Tin, Tout, A, V, L>;
  if (!cluster_fits<L>(kernel, device, static_cast<int>(chunks), block)) return false;
  const int64_t rows = (n + chunks - 1) / chunks;
  const int64_t tiles = (d + L * V - 1) / (L * V);
  const ClusterLaunch launch(checked_grid(tiles, "sum_rows"), block, static_cast<int>(chunks),
                             dev::stream_for(device));
  ACCRUE_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel,
                                       static_cast<const Tin*>(in.data_ptr()), n, d, rows,
                                       static_cast<Tout*>(out.data_ptr()), accumulate));
  return true;
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
  // Note [Column sums in one cluster]
  const int64_t cluster_chunks =
      std::min<int64_t>(kMaxClusterChunks, (n + kMinRowsPerChunk - 1) / kMinRowsPerChunk);
  if (n <= kMaxClusterRows) {
    const int lanes = cluster_lanes(d, V, cluster_chunks);
    if (lanes == 32 && sum_in_cluster<Tin, Tout, A, V, 32>(in, out, cluster_chunks, accumulate))
      return;
    if (lanes == 16 && sum_in_cluster<Tin, Tout, A, V, 16>(in, out, cluster_chunks, accumulate))
      return;
    if (lanes == 8 && sum_in_cluster<Tin, Tout, A, V, 8>(in, out, cluster_chunks, accumulate))
      return;
  }
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

}  // namespace

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

}  // namespace accrue::kernels::cuda
