// Column sums over many rows in an order fixed by the shape: how the CUDA
// norms (kernels/cuda/layer_norm.cu, rms_norm.cu) finish their weight and
// bias gradients.
//
// Note [Deterministic column sums]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dweight = sum over rows of dy * xhat (and LayerNorm's dbias = sum over
// rows of dy) are column sums over many rows. Pass 1, the norm's own kernel:
// block (x, y) sums 32 columns over one chunk of rows, each thread row a
// fixed stride of the chunk, then the 8 thread rows in order
// (column_tile_total), writing partial[chunk][column] (RMSNorm's fused
// backward writes one partial row per block instead). Pass 2, column_total:
// the chunks summed the same way, 32 columns a block, each of its 8 thread
// rows a fixed stride of the chunks; with more than 4 kSpan chunks, first in
// spans of kSpan chunks (column_span_sums_kernel), so that a column's total
// reads a few rows per thread, not a thousand on one thread. One thread per
// column over every chunk was slow: at 16384 x 768 bf16 RMSNorm (8,192
// partial rows) it took 58 us of a 100 us backward under ncu on an H200.
// The total is written (=) or added (+=). No float atomics: the order
// depends only on the shape and the chunking, never on scheduling (Note
// [Determinism]); LayerNorm's block-per-chunk kernel chunks by the SM count
// (Note [LayerNorm fused backward]), the other norms' by the shape.
#pragma once

#include <algorithm>
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/core/status_check.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/cuda/block_reduce.cuh"

namespace accrue::kernels::cuda {
namespace {

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kSpan = 64;

// Each column's sums of the 8 thread rows of a (32, 8) block, added in thread
// row order; the total is on thread row 0 (the other rows return their own).
template <class A>
__device__ __forceinline__ A column_tile_total(A s) {
  __shared__ A tile[kRowLanes][kColumnTile + 1];
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0) {
    for (int i = 1; i < kRowLanes; ++i)
      s += tile[i][threadIdx.x];
  }
  return s;
}

// Column c's sum over rows [begin, end) of in [*, d]: each thread row y a
// fixed stride of the rows, then the 8 thread rows in order; the total on
// thread row 0. Every thread of the (32, 8) block must call it.
template <class A>
__device__ __forceinline__ A column_rows_sum(const A* __restrict__ in, int64_t begin, int64_t end,
                                             int64_t d, int64_t c) {
  A s = 0;
  if (c < d) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes)
      s += in[r * d + c];
  }
  return column_tile_total(s);
}

// Up to two totals of the same shape, chunks and output type (LayerNorm's
// dweight and dbias) go through the same launches: the grid's last dimension
// picks the target, so a pair costs the launches of one.
template <class A, class O>
struct ColumnTotalTargets {
  const A* partial[2];
  O* out[2];
  int64_t out_stride[2];
  int count;  // 1 or 2
};

template <class A>
__global__ void column_span_sums_kernel(const A* __restrict__ in0, const A* __restrict__ in1,
                                        int64_t rows, int64_t d, A* __restrict__ out0,
                                        A* __restrict__ out1) {
  const A* in = blockIdx.z == 0 ? in0 : in1;
  A* out = blockIdx.z == 0 ? out0 : out1;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kSpan;
  const A s = column_rows_sum(in, begin, std::min(rows, begin + kSpan), d, c);
  if (threadIdx.y == 0 && c < d) out[blockIdx.y * d + c] = s;
}

// The chunks of each column summed (column_rows_sum over all of them) and
// written (=) or added (+=) to out[c * out_stride], of target blockIdx.y.
template <class A, class O>
__global__ void column_total_kernel(ColumnTotalTargets<A, O> t, int64_t chunks, int64_t d,
                                    bool accumulate) {
  const int i = static_cast<int>(blockIdx.y);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const A s = column_rows_sum(t.partial[i], 0, chunks, d, c);
  if (threadIdx.y == 0 && c < d) {
    O& o = t.out[i][c * t.out_stride[i]];
    o = ::accrue::cuda::convert<O>(accumulate ? reduce::load<A>(o) + s : s);
  }
}

// Note [Deterministic column sums], pass 2: each target's partial [chunks, d]
// (f32 or f64, A) summed over its rows into its out, on `stream`; scratch for
// the spans on `device`.
template <class A, class O>
void column_totals(ColumnTotalTargets<A, O> t, int64_t chunks, int64_t d, bool accumulate,
                   Device device, cudaStream_t stream) {
  const unsigned column_blocks = static_cast<unsigned>((d + kColumnTile - 1) / kColumnTile);
  const unsigned targets = static_cast<unsigned>(t.count);
  Tensor span_sums;
  if (chunks > 4 * kSpan) {  // two levels: spans of kSpan chunks first
    const int64_t spans = (chunks + kSpan - 1) / kSpan;
    span_sums = empty({t.count, spans, d}, dtype_of<A>::value, device);
    A* sums = static_cast<A*>(span_sums.data_ptr());
    column_span_sums_kernel<A>
        <<<dim3(column_blocks, static_cast<unsigned>(spans), targets), dim3(kColumnTile, kRowLanes),
           0, stream>>>(t.partial[0], t.count > 1 ? t.partial[1] : nullptr, chunks, d, sums,
                        t.count > 1 ? sums + spans * d : nullptr);
    ACCRUE_LAUNCH_CHECK();
    for (int i = 0; i < t.count; ++i)
      t.partial[i] = sums + i * spans * d;
    chunks = spans;
  }
  column_total_kernel<A, O>
      <<<dim3(column_blocks, targets), dim3(kColumnTile, kRowLanes), 0, stream>>>(t, chunks, d,
                                                                                  accumulate);
  ACCRUE_LAUNCH_CHECK();
}

// One target: partial [chunks, d] into out.
template <class A, class O>
void column_total(const Tensor& partial, int64_t chunks, int64_t d, O* out, int64_t out_stride,
                  bool accumulate, cudaStream_t stream) {
  ColumnTotalTargets<A, O> t{
      {static_cast<const A*>(partial.data_ptr()), nullptr}, {out, nullptr}, {out_stride, 0}, 1};
  column_totals<A, O>(t, chunks, d, accumulate, partial.device(), stream);
}

}  // namespace
}  // namespace accrue::kernels::cuda
