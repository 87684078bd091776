// CUDA halves of core's copies: strided copy with cast, fill, arange.
//
// A copy takes the first of four kernels that fits its layout (after Note
// [Collapsed geometry]): both contiguous, in 16-byte packs; the innermost dim
// contiguous in both (a permute that keeps the last dim, a narrow), in packs
// by rows (Note [Rows of packs]); a different dim contiguous in each (a
// transpose), through shared-memory tiles (Note [Tiled transpose]); anything
// else, one element per thread.
#include <algorithm>

#include "accrue/core/collapsed_geometry.h"
#include "accrue/core/copy.h"
#include "accrue/core/copy_geometry.h"
#include "accrue/core/cuda_pack.cuh"
#include "accrue/core/cuda_types.cuh"
#include "accrue/core/strided_index.h"

namespace accrue::detail {

namespace {

using cuda::load_pack;
using cuda::Pack;
using cuda::pack_aligned;
using cuda::store_pack;

constexpr int kThreads = 256;

// The widest pack that moves 16 bytes of the wider of D and S.
template <class D, class S>
constexpr int pack_width() {
  return 16 / static_cast<int>(sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
}

template <int V, class D, class S>
__device__ __forceinline__ void copy_pack(D* out, const S* in, int64_t i) {
  const Pack<S, V> x = load_pack<V>(in, i);
  Pack<D, V> y;
#pragma unroll
  for (int j = 0; j < V; ++j)
    y.v[j] = cuda::convert<D>(x.v[j]);
  store_pack<V>(out, i, y);
}

// out[i] = in[i] (with a cast) over contiguous tensors, in packs when both
// pointers allow, the tail one by one.
template <int V, class D, class S>
__global__ void __launch_bounds__(kThreads)
    copy_contiguous_kernel(D* __restrict__ out, const S* __restrict__ in, int64_t n,
                           bool vectorized) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = vectorized ? n / V : 0;
  for (int64_t p = tid; p < packs; p += stride)
    copy_pack<V>(out, in, p);
  for (int64_t i = packs * V + tid; i < n; i += stride)
    out[i] = cuda::convert<D>(in[i]);
}

// Note [Rows of packs] (core/collapsed_geometry.h) for a copy: dim 0
// contiguous in both, moved in packs; `rows` places each row.
template <int V, class D, class S>
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(D* __restrict__ out, const S* __restrict__ in, int64_t packs,
                     RowSplitter split, CollapsedGeometry<2> rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    int64_t row, col;
    split.split(p, row, col);
    int64_t off[2];
    rows.offsets(row, off);
    copy_pack<V>(out + off[0], in + off[1], col);
  }
}

// Note [Tiled transpose]
// ~~~~~~~~~~~~~~~~~~~~~~
// When the dim that is contiguous in the source (a) is not the one contiguous
// in the destination (b) (a transpose, K^T of attention, a permute that moves
// the last dim), any one-pass order reads or writes with a stride. Each block
// of 32 x 8 threads takes a kTile x kTile tile of (a, b) in one batch index
// (the other dims): it reads the tile along a, a warp taking the 64
// consecutive source elements of a row in two loads of 32, into shared
// memory, and writes it along b the same way. A thread loads all
// kTile * kTile / 256 = 16 of its elements before storing any, so each has
// 16 loads in flight; the tile's rows are padded so that the column reads
// hit 32 different banks (2-way for 8-byte types, which take two wavefronts
// anyway). Tiles are numbered over (a, b, batch) and walked grid-stride, so
// any size runs on a capped grid. Measured on an H200 (bench/RESULTS.md):
// 0.92 of the copy rate on an 8192^2 f32 transpose, 0.64 on bf16 K^T.
constexpr int kTile = 64;
constexpr int kTileCols = 32;                      // threads along the tile's rows
constexpr int kTileRows = 8;                       // threads along its columns
constexpr int kPerThread = kTile / kTileCols;      // 2 elements along a row
constexpr int kRowsPerThread = kTile / kTileRows;  // 8 rows

template <class D, class S>
__global__ void __launch_bounds__(kTileCols* kTileRows)
    copy_transpose_kernel(D* __restrict__ out, const S* __restrict__ in, int64_t size_a,
                          int64_t size_b, int64_t out_stride_a, int64_t in_stride_b,
                          int64_t tiles_a, int64_t tiles_b, int64_t tiles,
                          CollapsedGeometry<2> batch) {
  // One 4-byte word of padding per row (for 8-byte types one element), so a
  // row's length is an odd number of words and a column read meets no bank twice.
  constexpr int kPad = sizeof(S) >= 4 ? 1 : 4 / static_cast<int>(sizeof(S));
  __shared__ S tile[kTile][kTile + kPad];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t ta = t % tiles_a;
    const int64_t tb = (t / tiles_a) % tiles_b;
    int64_t base[2];
    batch.offsets(t / (tiles_a * tiles_b), base);
    const int64_t a0 = ta * kTile, b0 = tb * kTile;
    // Read along a (stride 1 in the source): row j of the tile is b = b0 + j.
    S x[kRowsPerThread][kPerThread] = {};
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t b = b0 + threadIdx.y + r * kTileRows;
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) {
        const int64_t a = a0 + threadIdx.x + c * kTileCols;
        if (a < size_a && b < size_b) x[r][c] = in[base[1] + a + b * in_stride_b];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
      for (int c = 0; c < kPerThread; ++c)
        tile[threadIdx.y + r * kTileRows][threadIdx.x + c * kTileCols] = x[r][c];
    __syncthreads();
    // Write along b (stride 1 in the destination): row j is a = a0 + j.
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t a = a0 + threadIdx.y + r * kTileRows;
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) {
        const int64_t b = b0 + threadIdx.x + c * kTileCols;
        if (a < size_a && b < size_b)
          out[base[0] + b + a * out_stride_a] =
              cuda::convert<D>(tile[threadIdx.x + c * kTileCols][threadIdx.y + r * kTileRows]);
      }
    }
    __syncthreads();
  }
}

// Any other layout: each element decomposes its own index.
template <class D, class S>
__global__ void __launch_bounds__(kThreads)
    copy_strided_kernel(D* out, const S* in, int64_t n, CollapsedGeometry<2> g) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    g.offsets(i, off);
    out[off[0]] = cuda::convert<D>(in[off[1]]);
  }
}

// The collapsed dim of `g` in which operand k has stride 1, or -1.
int unit_stride_dim(const CollapsedGeometry<2>& g, int k) {
  for (int d = 0; d < g.rank; ++d)
    if (g.strides[k][d] == 1) return d;
  return -1;
}

template <class D, class S>
void launch_copy(D* out, const Tensor& dst, const S* in, const Tensor& src, cudaStream_t stream) {
  const int64_t n = dst.numel();
  constexpr int V = pack_width<D, S>();
  const bool aligned = pack_aligned<V>(out) && pack_aligned<V>(in);
  if (dst.is_contiguous() && src.is_contiguous()) {
    copy_contiguous_kernel<V, D, S>
        <<<cuda::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(out, in, n, aligned);
    return;
  }
  const CollapsedGeometry<2> g =
      collapse_geometry<2>(dst.shape(), {&dst.strides(), &src.strides()}, "copy");
  if (aligned && rows_of_packs(g, V)) {
    const int64_t packs = n / V;
    copy_rows_kernel<V, D, S><<<cuda::grid_for(packs, kThreads), kThreads, 0, stream>>>(
        out, in, packs, RowSplitter(packs, g.sizes[0] / V), g.without(0));
    return;
  }
  const int a = unit_stride_dim(g, 1), b = unit_stride_dim(g, 0);
  if (a >= 0 && b >= 0 && a != b) {
    const int64_t tiles_a = (g.sizes[a] + kTile - 1) / kTile;
    const int64_t tiles_b = (g.sizes[b] + kTile - 1) / kTile;
    const CollapsedGeometry<2> batch = g.without(a, b);
    const int64_t tiles = tiles_a * tiles_b * batch.numel();
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{1} << 20));
    copy_transpose_kernel<D, S><<<blocks, dim3(kTileCols, kTileRows), 0, stream>>>(
        out, in, g.sizes[a], g.sizes[b], g.strides[0][a], g.strides[1][b], tiles_a, tiles_b, tiles,
        batch);
    return;
  }
  copy_strided_kernel<D, S><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n, g);
}

template <class D>
__global__ void fill_kernel(D* out, StridedGeometry g, D value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[g.offset_of(i)] = value;
}

template <class D>
__global__ void arange_kernel(D* out, double start, double step, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cuda::convert<D>(start + static_cast<double>(i) * step);
}

}  // namespace

void copy_cuda(const Tensor& dst, const Tensor& src) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cudaStream_t stream = cuda::stream_for(dev);
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  if (contiguous && dst.dtype() == src.dtype()) {
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (n == 0) return;
  cuda::visit_any_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    cuda::visit_any_device_dtype(src.dtype(), [&](auto s) {
      using S = decltype(s);
      launch_copy(static_cast<D*>(dst.data_ptr()), dst, static_cast<const S*>(src.data_ptr()), src,
                  stream);
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void fill_cuda(const Tensor& dst, double value) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cuda::visit_any_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D v = cuda::convert<D>(value);
    fill_kernel<D><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::stream_for(dev)>>>(
        static_cast<D*>(dst.data_ptr()), geometry_of(dst), v, n);
    ACCRUE_LAUNCH_CHECK();
  });
}

void arange_cuda(const Tensor& dst, double start, double step) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cuda::visit_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    arange_kernel<D><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::stream_for(dev)>>>(
        static_cast<D*>(dst.data_ptr()), start, step, n);
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::detail
