// CUDA layer-norm kernels, forward and backward.
//
// Every reduction runs in a fixed order (warp shuffles and shared memory in a
// fixed tree, per-chunk partial sums added in an order fixed by the shape;
// Note [Deterministic column sums]): no float atomics, so the same inputs
// give the same bits on every run of one GPU model (Note [Determinism]).
// 16-bit inputs compute in fp32, f64 in f64.
#include <algorithm>
#include <type_traits>

#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/column_sums.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"

namespace accrue::kernels::cuda {

namespace {

using namespace reduce;  // sqrt_, load, block_sum

// ---- layer norm ---------------------------------------------------------------------

// One block per row, two passes for the statistics (mean, then the biased
// variance around it), like the CPU reference.
template <class T, class A>
__global__ void layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                  const T* __restrict__ bias, int64_t d, A eps, T* __restrict__ out,
                                  A* __restrict__ mean, A* __restrict__ rstd) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  T* yr = out + r * d;
  A s = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    s += load<A>(xr[c]);
  const A mu = block_sum(s, scratch) / static_cast<A>(d);
  A v = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const A z = load<A>(xr[c]) - mu;
    v += z * z;
  }
  const A var = block_sum(v, scratch) / static_cast<A>(d);
  const A rs = A(1) / sqrt_(var + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    A y = (load<A>(xr[c]) - mu) * rs;
    if (weight) y *= load<A>(weight[c]);
    if (bias) y += load<A>(bias[c]);
    yr[c] = cu::convert<T>(y);
  }
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// One block per row. With xhat = (x - mean) * rstd and gw = dy * w:
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)).
template <class T, class A>
__global__ void layer_norm_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const T* __restrict__ weight, const A* __restrict__ mean,
                                     const A* __restrict__ rstd, int64_t d,
                                     const T* __restrict__ add, T* __restrict__ dx) {
  __shared__ A scratch[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  const A mu = mean[r], rs = rstd[r];
  A sum_gw = 0, sum_gw_xhat = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const A xhat = (load<A>(xr[c]) - mu) * rs;
    const A gw = weight ? load<A>(gr[c]) * load<A>(weight[c]) : load<A>(gr[c]);
    sum_gw += gw;
    sum_gw_xhat += gw * xhat;
  }
  const A inv_d = A(1) / static_cast<A>(d);
  const A mean_gw = block_sum(sum_gw, scratch) * inv_d;
  const A mean_gw_xhat = block_sum(sum_gw_xhat, scratch) * inv_d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const A xhat = (load<A>(xr[c]) - mu) * rs;
    const A gw = weight ? load<A>(gr[c]) * load<A>(weight[c]) : load<A>(gr[c]);
    const A v = rs * (gw - mean_gw - xhat * mean_gw_xhat);
    dx[r * d + c] = cu::convert<T>(add ? v + load<A>(add[r * d + c]) : v);
  }
}

// The per-pack math that both backward kernels below (the fused and the warp
// one) share: a pack's share of the row's two sums (dy * w and dy * w *
// xhat), then, with their means, the pack's dx (plus the pack of add_row
// where there is one, rounded once) and its dweight and dbias terms added to
// the thread's registers.
template <class T, class A, int V>
__device__ __forceinline__ void pack_row_sums(const ::accrue::cuda::Pack<T, V>& a,
                                              const ::accrue::cuda::Pack<T, V>& g,
                                              const T* __restrict__ weight, int64_t k, A mu, A rs,
                                              A& sum_gw, A& sum_gw_xhat) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const A xhat = (load<A>(a.v[v]) - mu) * rs;
    const A gw = weight ? load<A>(g.v[v]) * load<A>(weight[k * V + v]) : load<A>(g.v[v]);
    sum_gw += gw;
    sum_gw_xhat += gw * xhat;
  }
}

template <class T, class A, int V>
__device__ __forceinline__ ::accrue::cuda::Pack<T, V> pack_dx(
    const ::accrue::cuda::Pack<T, V>& a, const ::accrue::cuda::Pack<T, V>& g,
    const T* __restrict__ weight, int64_t k, A mu, A rs, A mean_gw, A mean_gw_xhat,
    const T* __restrict__ add_row, A (&acc_w)[V], A (&acc_b)[V]) {
  ::accrue::cuda::Pack<T, V> out, add;
  if (add_row) add = ::accrue::cuda::load_pack<V>(add_row, k);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const A xhat = (load<A>(a.v[v]) - mu) * rs;
    const A gv = load<A>(g.v[v]);
    const A gw = weight ? gv * load<A>(weight[k * V + v]) : gv;
    const A dx = rs * (gw - mean_gw - xhat * mean_gw_xhat);
    out.v[v] = cu::convert<T>(add_row ? dx + load<A>(add.v[v]) : dx);
    acc_w[v] += gv * xhat;
    acc_b[v] += gv;
  }
  return out;
}

// Note [LayerNorm fused backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where a row is a whole number of 16-byte packs, at most kFusedPacks a
// thread, and the tensors are 16-byte aligned, one kernel makes dx and the
// parameter partials. Block b takes the rows of chunk b one after another,
// each thread the packs k = t, t + blockDim.x, ... of the row: it reads x and
// dy for the row's two sums, then again (from the cache) for dx, adding
// dy * xhat and dy of its columns to registers in row order, and at the end
// writes the chunk's partial rows, which column_total adds (Note
// [Deterministic column sums]). The chunks follow the SM count (below), so
// the sums' order depends on the shape and the GPU model, never on
// scheduling: one model gives the same bits on every run. So dy
// and x come from memory once for both gradients, where the one-block-per-row
// dx kernel and the partials kernel read them twice, in 16-byte packs where
// those load 2 or 4 bytes at a time. The chunks are sized for about
// kFusedBlocksPerSm blocks on each SM, and the kernel is used only where a
// chunk has at least kFusedMinRowsPerChunk rows: a block runs its rows one
// after another, so with few rows it waits on memory with little in flight,
// and the many short chunks need the column totals' second level. Measured
// on an H200 (bf16 GPT-2, windows of 32,768 tokens): 63 rows a chunk (124M,
// 32 x 1) gave 1.04-1.06x the window, 16 (124M and 1.5B, 8 x 4) 1.02-1.03x,
// but 2 (124M, 1 x 32: 1,024 rows) 0.964x; 2 to 15 are not measured and keep
// the two kernels. Rows of at most 32 * kWarpPacks packs (those GPT-2 124M
// rows among them) now go to the warp kernel first (Note [LayerNorm warp
// backward]), this one takes wider rows (GPT-2 1.5B's 1,600).
constexpr int kFusedPacks = 4;
constexpr int kFusedThreads = 512;
constexpr int kFusedBlocksPerSm = 4;
constexpr int64_t kFusedMinRowsPerChunk = 16;

template <class T, class A, int V>
__global__ void __launch_bounds__(kFusedThreads)
    layer_norm_backward_fused_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const T* __restrict__ weight, const A* __restrict__ mean,
                                     const A* __restrict__ rstd, int64_t rows, int64_t d,
                                     int64_t rows_per_chunk, const T* __restrict__ add,
                                     T* __restrict__ dx, A* __restrict__ partial_dw,
                                     A* __restrict__ partial_db) {
  using ::accrue::cuda::load_pack;
  using ::accrue::cuda::Pack;
  using ::accrue::cuda::store_pack;
  __shared__ A scratch[32];
  const int64_t packs = d / V;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t end = std::min(rows, begin + rows_per_chunk);
  const A inv_d = A(1) / static_cast<A>(d);
  A acc_w[kFusedPacks][V] = {}, acc_b[kFusedPacks][V] = {};
  // Every thread of the block runs every row (the block sums need them all).
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    const A mu = mean[r], rs = rstd[r];
    A sum_gw = 0, sum_gw_xhat = 0;
#pragma unroll
    for (int j = 0; j < kFusedPacks; ++j) {
      const int64_t k = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (k >= packs) continue;
      const Pack<T, V> a = load_pack<V>(xr, k), g = load_pack<V>(gr, k);
      pack_row_sums<T, A, V>(a, g, weight, k, mu, rs, sum_gw, sum_gw_xhat);
    }
    const A mean_gw = block_sum(sum_gw, scratch) * inv_d;
    const A mean_gw_xhat = block_sum(sum_gw_xhat, scratch) * inv_d;
#pragma unroll
    for (int j = 0; j < kFusedPacks; ++j) {
      const int64_t k = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (k >= packs) continue;
      const Pack<T, V> a = load_pack<V>(xr, k), g = load_pack<V>(gr, k);
      store_pack<V>(dx + r * d, k,
                    pack_dx<T, A, V>(a, g, weight, k, mu, rs, mean_gw, mean_gw_xhat,
                                     add ? add + r * d : nullptr, acc_w[j], acc_b[j]));
    }
  }
#pragma unroll
  for (int j = 0; j < kFusedPacks; ++j) {
    const int64_t k = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (k >= packs) continue;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = k * V + v;
      if (partial_dw) partial_dw[blockIdx.x * d + c] = acc_w[j][v];
      if (partial_db) partial_db[blockIdx.x * d + c] = acc_b[j][v];
    }
  }
}

// Note [LayerNorm warp backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where a row is whole 16-byte packs, at most 32 * kWarpPacks of them (bf16
// rows up to 1,024 wide: GPT-2 124M's 768), and the tensors are aligned, one
// kernel makes dx and the parameter partials with a warp a row: lane l takes
// the packs l, l + 32, ... of each of its warp's rows, the row's two sums are
// warp butterflies (no barrier), and the lane adds dy * xhat and dy of its
// columns in row order in registers. A warp takes rows_per_warp consecutive
// rows, a block kWarpRows warps; at the end each warp writes its sums to a
// shared row of its own, and after one barrier the block adds the rows in
// warp order into one partial row (as Note [RMSNorm backward] does), which
// column_total adds (Note [Deterministic column sums]). The rows take
// kWarpRows * d elements of shared memory: 32 KiB at 1,024 f32 sums.
// rows_per_warp depends on the row count alone (about kWarpTarget warps), so
// the sums' order depends on the shape alone. Against the block-per-chunk
// kernel (Note [LayerNorm fused backward]), which runs its rows one after
// another with two block barriers each, eight rows of a block are in flight
// at once, so a micro-batch of 1,024 rows fills one wave of 128 blocks
// instead of 512 chunks of 2 rows. Measured
// against main on an H200 (bf16 GPT-2 124M, tok/s): 1.014x at 1 x 32, 1.005x
// at 8 x 4, 1.022x at 32 x 1, where it replaced the fused kernel too
// (bench/RESULTS.md, eleventh session).
// kWarpTarget: 2,048 warps are 256 blocks, one wave at two blocks an SM (the
// launch bounds) of an H100's or H200's 132 SMs. Each block's partial rows
// are written and read again, so blocks beyond one wave cost bytes, and
// fewer leave SMs idle. Against 4,096 (bench/RESULTS.md, twenty-third
// session; GPT-2 124M on an H200, tok/s): 1.011x at 4 x 8 (2 rows a warp
// instead of 1), 1.008x at 8 x 4, 1.014x at 32 x 1 (16 instead of 8); 1,024,
// 8,192 and 16,384 were no faster than 4,096 anywhere.
constexpr int kWarpPacks = 4;
constexpr int kWarpRows = 8;
constexpr int64_t kWarpTarget = 2048;

template <class T, class A, int V, int P>
__global__ void __launch_bounds__(kWarpRows * 32, 2)
    layer_norm_backward_warp_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ weight, const A* __restrict__ mean,
                                    const A* __restrict__ rstd, int64_t rows, int64_t d,
                                    int64_t rows_per_warp, const T* __restrict__ add,
                                    T* __restrict__ dx, A* __restrict__ partial_dw,
                                    A* __restrict__ partial_db) {
  using ::accrue::cuda::load_pack;
  using ::accrue::cuda::Pack;
  using ::accrue::cuda::store_pack;
  // [kWarpRows][d] of A: each warp's column sums.
  extern __shared__ __align__(16) unsigned char warp_rows_raw[];
  A* warp_rows = reinterpret_cast<A*>(warp_rows_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t packs = d / V;
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) * kWarpRows + warp) * rows_per_warp;
  const int64_t end = std::min(rows, begin + rows_per_warp);
  const A inv_d = A(1) / static_cast<A>(d);
  A acc_w[P][V] = {}, acc_b[P][V] = {};
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    const A mu = mean[r], rs = rstd[r];
    Pack<T, V> a[P], g[P];
    A sum_gw = 0, sum_gw_xhat = 0;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t k = lane + 32 * j;
      if (k >= packs) continue;
      a[j] = load_pack<V>(xr, k);
      g[j] = load_pack<V>(gr, k);
      pack_row_sums<T, A, V>(a[j], g[j], weight, k, mu, rs, sum_gw, sum_gw_xhat);
    }
    const A mean_gw = warp_sum(sum_gw) * inv_d;
    const A mean_gw_xhat = warp_sum(sum_gw_xhat) * inv_d;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t k = lane + 32 * j;
      if (k >= packs) continue;
      store_pack<V>(dx + r * d, k,
                    pack_dx<T, A, V>(a[j], g[j], weight, k, mu, rs, mean_gw, mean_gw_xhat,
                                     add ? add + r * d : nullptr, acc_w[j], acc_b[j]));
    }
  }
  // The block's partial rows, dweight's then dbias's: each warp writes its
  // sums to a row of its own, and after one barrier the rows are added in
  // warp order (Note [RMSNorm backward] measured a barrier per warp in turn
  // at 30% of the stalls).
  auto block_partial = [&](const A(&acc)[P][V], A* partial) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t k = lane + 32 * j;
      if (k >= packs) continue;
#pragma unroll
      for (int v = 0; v < V; ++v)
        warp_rows[warp * d + k * V + v] = acc[j][v];
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      A sum = warp_rows[c];
      for (int w = 1; w < kWarpRows; ++w)
        sum += warp_rows[w * d + c];
      partial[blockIdx.x * d + c] = sum;
    }
    __syncthreads();  // the rows are reused
  };
  if (partial_dw) block_partial(acc_w, partial_dw);
  if (partial_db) block_partial(acc_b, partial_db);
}

// Note [Deterministic column sums] (kernels/cuda/column_sums.cuh), pass 1:
// block (x, y) sums 32 columns of dy * xhat and of dy over one chunk of rows.
template <class T, class A>
__global__ void layer_norm_param_partials_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                 const A* __restrict__ mean,
                                                 const A* __restrict__ rstd, int64_t rows,
                                                 int64_t d, int64_t rows_per_chunk,
                                                 A* __restrict__ partial_dw,
                                                 A* __restrict__ partial_db) {
  __shared__ A tile_w[kRowLanes][kColumnTile + 1];
  __shared__ A tile_b[kRowLanes][kColumnTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = std::min(rows, begin + rows_per_chunk);
  A acc_w = 0, acc_b = 0;
  if (c < d) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const A g = load<A>(dy[r * d + c]);
      acc_b += g;
      acc_w += g * ((load<A>(x[r * d + c]) - mean[r]) * rstd[r]);
    }
  }
  tile_w[threadIdx.y][threadIdx.x] = acc_w;
  tile_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    for (int i = 1; i < kRowLanes; ++i) {
      acc_w += tile_w[i][threadIdx.x];
      acc_b += tile_b[i][threadIdx.x];
    }
    if (partial_dw) partial_dw[blockIdx.y * d + c] = acc_w;
    if (partial_db) partial_db[blockIdx.y * d + c] = acc_b;
  }
}

template <class P>
const P* optional_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.data_ptr()) : nullptr;
}

}  // namespace

// ---- the backend functions -------------------------------------------------------------

void layer_norm(const Tensor& x, const Tensor& weight_in, const Tensor& bias_in, double eps,
                const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = x.size(0), d = x.size(1);
  if (rows == 0) return;
  check_grid_x(rows, "layer_norm");
  const DType acc = accumulate_dtype(x.dtype());
  ACCRUE_CHECK(mean.dtype() == acc && rstd.dtype() == acc, "layer_norm: mean/rstd dtype ",
               dtype_name(mean.dtype()), " should be ", dtype_name(acc));
  // Parameters in x's dtype (dispatch guarantees it; the conversion is a no-op then).
  const Tensor weight = as_dtype(weight_in, x.dtype());
  const Tensor bias = as_dtype(bias_in, x.dtype());
  cu::visit_float_dtype(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    layer_norm_kernel<T, A>
        <<<static_cast<unsigned>(rows), row_threads(d), 0, cu::stream_for(dev)>>>(
            static_cast<const T*>(x.data_ptr()), optional_ptr<T>(weight), optional_ptr<T>(bias), d,
            static_cast<A>(eps), static_cast<T*>(out.data_ptr()), static_cast<A*>(mean.data_ptr()),
            static_cast<A*>(rstd.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
}

void layer_norm_backward_partials(const Tensor& grad_in, const Tensor& x, const Tensor& weight_in,
                                  const Tensor& mean_in, const Tensor& rstd_in, const Tensor& dx,
                                  const Tensor& dx_add, bool want_dweight, bool want_dbias,
                                  NormPartials* partials) {
  const int dev = x.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const int64_t rows = x.size(0), d = x.size(1);
  check_grid_x(rows, "layer_norm_backward");
  const DType acc = accumulate_dtype(x.dtype());
  const Tensor grad = as_dtype(grad_in, x.dtype());
  const Tensor mean = as_dtype(mean_in, acc);
  const Tensor rstd = as_dtype(rstd_in, acc);
  const Tensor weight = as_dtype(weight_in, x.dtype());

  cu::visit_float_dtype(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    const Device device = Device::cuda(dev);
    auto partial_ptr = [](const Tensor& t) {
      return t.defined() ? static_cast<A*>(t.data_ptr()) : nullptr;
    };
    const T* add = optional_ptr<T>(dx_add);
    // The partial rows go to norm_param_totals.
    auto finish = [&](const Tensor& partial_dw, const Tensor& partial_db, int64_t chunks) {
      partials->dweight = partial_dw;
      partials->dbias = partial_db;
      partials->chunks = chunks;
    };
    // Note [LayerNorm fused backward]: dx and the partials from one read of dy and x.
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const int64_t packs = d / V;
    const int64_t target = int64_t{kFusedBlocksPerSm} * cu::sm_count(dev);
    const int64_t fused_rows_per_chunk = (rows + target - 1) / target;
    const bool fused_shape =
        rows > 0 && d > 0 && d % V == 0 && packs <= int64_t{kFusedThreads} * kFusedPacks &&
        cu::pack_aligned<V>(static_cast<const T*>(grad.data_ptr())) &&
        cu::pack_aligned<V>(static_cast<const T*>(x.data_ptr())) &&
        cu::pack_aligned<V>(static_cast<T*>(dx.data_ptr())) &&
        (add == nullptr || cu::pack_aligned<V>(add)) &&
        (!weight.defined() || cu::pack_aligned<V>(static_cast<const T*>(weight.data_ptr())));
    // Note [LayerNorm warp backward]: rows of at most kWarpPacks packs a lane.
    const int64_t lane_packs = (packs + 31) / 32;
    if (fused_shape && lane_packs <= kWarpPacks) {
      const int64_t rows_per_warp = std::max<int64_t>(1, (rows + kWarpTarget - 1) / kWarpTarget);
      const int64_t block_rows = rows_per_warp * kWarpRows;
      const int64_t chunks = (rows + block_rows - 1) / block_rows;
      Tensor partial_dw = want_dweight ? empty({chunks, d}, acc, device) : Tensor();
      Tensor partial_db = want_dbias ? empty({chunks, d}, acc, device) : Tensor();
      const size_t shared = size_t{kWarpRows} * static_cast<size_t>(d) * sizeof(A);
      auto launch = [&](auto p_tag) {
        constexpr int P = decltype(p_tag)::value;
        layer_norm_backward_warp_kernel<T, A, V, P>
            <<<static_cast<unsigned>(chunks), kWarpRows * 32, shared, stream>>>(
                static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
                optional_ptr<T>(weight), static_cast<const A*>(mean.data_ptr()),
                static_cast<const A*>(rstd.data_ptr()), rows, d, rows_per_warp, add,
                static_cast<T*>(dx.data_ptr()), partial_ptr(partial_dw), partial_ptr(partial_db));
      };
      if (lane_packs == 1)
        launch(std::integral_constant<int, 1>{});
      else if (lane_packs == 2)
        launch(std::integral_constant<int, 2>{});
      else if (lane_packs == 3)
        launch(std::integral_constant<int, 3>{});
      else
        launch(std::integral_constant<int, 4>{});
      ACCRUE_LAUNCH_CHECK();
      finish(partial_dw, partial_db, chunks);
      return;
    }
    if (fused_shape && fused_rows_per_chunk >= kFusedMinRowsPerChunk) {
      const int64_t threads =
          std::min<int64_t>(kFusedThreads, std::max<int64_t>(32, (packs + 31) / 32 * 32));
      const int64_t chunks = (rows + fused_rows_per_chunk - 1) / fused_rows_per_chunk;
      Tensor partial_dw = want_dweight ? empty({chunks, d}, acc, device) : Tensor();
      Tensor partial_db = want_dbias ? empty({chunks, d}, acc, device) : Tensor();
      layer_norm_backward_fused_kernel<T, A, V>
          <<<static_cast<unsigned>(chunks), static_cast<unsigned>(threads), 0, stream>>>(
              static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
              optional_ptr<T>(weight), static_cast<const A*>(mean.data_ptr()),
              static_cast<const A*>(rstd.data_ptr()), rows, d, fused_rows_per_chunk, add,
              static_cast<T*>(dx.data_ptr()), partial_ptr(partial_dw), partial_ptr(partial_db));
      ACCRUE_LAUNCH_CHECK();
      finish(partial_dw, partial_db, chunks);
      return;
    }
    if (rows > 0 && d > 0) {
      layer_norm_dx_kernel<T, A><<<static_cast<unsigned>(rows), row_threads(d), 0, stream>>>(
          static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
          optional_ptr<T>(weight), static_cast<const A*>(mean.data_ptr()),
          static_cast<const A*>(rstd.data_ptr()), d, add, static_cast<T*>(dx.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    }
    if ((!want_dweight && !want_dbias) || d == 0) return;

    // See Note [Deterministic column sums]. About 64 rows per chunk, at most 1024 chunks.
    const int64_t chunks = std::min<int64_t>((rows + 63) / 64, 1024);
    const int64_t rows_per_chunk = chunks == 0 ? 0 : (rows + chunks - 1) / chunks;
    Tensor partial_dw = want_dweight ? empty({chunks, d}, acc, device) : Tensor();
    Tensor partial_db = want_dbias ? empty({chunks, d}, acc, device) : Tensor();
    if (chunks > 0) {
      const dim3 grid(static_cast<unsigned>((d + kColumnTile - 1) / kColumnTile),
                      static_cast<unsigned>(chunks));
      layer_norm_param_partials_kernel<T, A><<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
          static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
          static_cast<const A*>(mean.data_ptr()), static_cast<const A*>(rstd.data_ptr()), rows, d,
          rows_per_chunk, partial_ptr(partial_dw), partial_ptr(partial_db));
      ACCRUE_LAUNCH_CHECK();
    }
    finish(partial_dw, partial_db, chunks);
  });
}

void norm_param_totals(const NormPartials& partials, const Tensor& dweight, const Tensor& dbias,
                       bool accumulate) {
  const Tensor& any = partials.dweight.defined() ? partials.dweight : partials.dbias;
  const int dev = any.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const Device device = Device::cuda(dev);
  const int64_t chunks = partials.chunks, d = partials.d;
  cu::visit_float_dtype(partials.x_dtype, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    auto partial_ptr = [](const Tensor& t) {
      return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
    };
    // The totals of one target, or of two in one dtype (Note [Deterministic column sums]).
    auto totals = [&](const Tensor& p0, const Tensor& t0, const Tensor& p1, const Tensor& t1) {
      visit_grad_dtype<T>(t0.dtype(), "layer_norm_backward", [&](auto o_tag) {
        using O = decltype(o_tag);
        const bool two = t1.defined();
        ColumnTotalTargets<A, O> t{
            {partial_ptr(p0), two ? partial_ptr(p1) : nullptr},
            {static_cast<O*>(t0.data_ptr()), two ? static_cast<O*>(t1.data_ptr()) : nullptr},
            {t0.stride(0), two ? t1.stride(0) : 0},
            two ? 2 : 1};
        column_totals<A, O>(t, chunks, d, accumulate, device, stream);
      });
    };
    // dweight's and dbias's totals in the same launches when both are wanted in
    // one dtype (at GPT-2 124M 1 x 32, 800 launches of 2.9 us fewer a window).
    if (dweight.defined() && dbias.defined() && dweight.dtype() == dbias.dtype())
      return totals(partials.dweight, dweight, partials.dbias, dbias);
    if (dweight.defined()) totals(partials.dweight, dweight, Tensor(), Tensor());
    if (dbias.defined()) totals(partials.dbias, dbias, Tensor(), Tensor());
  });
}

}  // namespace accrue::kernels::cuda
