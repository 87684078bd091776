// CUDA sum_rows: the column sums of a [n, d] matrix (the Linear bias
// gradient), in the order of Note [Fixed reduction order]
// (kernels/cuda/row_reduce.cuh).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/row_reduce.cuh"

namespace accrue::kernels::cuda {
namespace {

// sum_rows: the least number of rows a block sums before rows are split across blocks.
constexpr int64_t kMinRowsPerChunk = 64;

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
