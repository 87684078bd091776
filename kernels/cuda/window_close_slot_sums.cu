// The CUDA layer monitor's per-slot sums (kernels/cuda/window_close.cuh): the
// fused optimizer pass's chunk rows (Note [Step sums]) folded per slot.
#include <algorithm>
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/window_close.cuh"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels::cuda {
namespace {

// ---- the monitor's per-slot sums -----------------------------------------------------------

constexpr int kSlotThreads = 256;
constexpr int64_t kTileChunks = 2048;  // 64 KiB of f32 elements, 48 KiB of rows per tile

// Note [Step sums]: the fold in two launches, so that a slot of a million
// chunks (GPT-2's token embedding) is spread over the GPU instead of one
// block. The chunk axis is cut into fixed tiles of kTileChunks; launch 1 has
// one block per tile and writes, for each slot that meets the tile, the
// slot's share of it as a partial row (|g|^2, |du|^2, |p|^2, non-finite
// count); launch 2 has one block per slot and adds the slot's partials in
// tile order. The cut depends on the chunk numbers alone, so the result is
// bitwise the same on every run and every GPU. Slot s owns partial rows
// [offset(s), offset(s) + tiles(s)), offset the sum of tiles() of the slots
// before it: at most tiles + slots rows for ascending, disjoint ranges (a
// GradArena's), and a row past that is never written or read, so bad ranges
// give wrong sums but never touch memory outside the buffers.
struct SlotSpan {
  int64_t c0, c1, first_tile, tiles;
};

__device__ __forceinline__ SlotSpan slot_span(const int64_t* ranges, int64_t slot, int64_t chunks) {
  SlotSpan s;
  s.c0 = std::min(std::max(ranges[2 * slot], int64_t{0}), chunks);
  s.c1 = std::min(std::max(ranges[2 * slot + 1], s.c0), chunks);
  s.first_tile = s.c0 / kTileChunks;
  s.tiles = s.c1 > s.c0 ? (s.c1 - 1) / kTileChunks - s.first_tile + 1 : 0;
  return s;
}

// Launch 1: tile blockIdx.x. Each thread a strided share of the slot's
// chunks in the tile (or, after a skipped window, of their elements), then
// the block in a fixed order.
template <class T>
__global__ void __launch_bounds__(kSlotThreads)
    tile_sums_kernel(const double* __restrict__ rows, const int64_t* __restrict__ ranges,
                     int64_t slots, int64_t chunks, const T* __restrict__ grads,
                     const T* __restrict__ params, int64_t n, const double* __restrict__ state,
                     double* __restrict__ partials, int64_t capacity) {
  __shared__ double scratch[32];
  const int64_t tile = blockIdx.x;
  const int64_t t0 = tile * kTileChunks, t1 = std::min(t0 + kTileChunks, chunks);
  const bool skipped = state[kFoundInf] != 0.0;  // Note [Skipped window]: no row was written
  int64_t offset = 0;
  for (int64_t slot = 0; slot < slots; ++slot) {
    const SlotSpan s = slot_span(ranges, slot, chunks);
    if (s.c0 >= t1) break;  // ascending ranges: no later slot meets the tile
    const int64_t row = offset + tile - s.first_tile;
    offset += s.tiles;
    if (tile < s.first_tile || tile >= s.first_tile + s.tiles || row >= capacity) continue;
    const int64_t c0 = std::max(s.c0, t0), c1 = std::min(s.c1, t1);
    double g2 = 0.0, d2 = 0.0, p2 = 0.0, bad = 0.0;
    if (!skipped) {
      for (int64_t c = c0 + threadIdx.x; c < c1; c += kSlotThreads) {
        g2 += rows[3 * c];
        d2 += rows[3 * c + 1];
        p2 += rows[3 * c + 2];
      }
    } else {
      const int64_t end = std::min(c1 * kChunk, n);
      for (int64_t e = std::min(c0 * kChunk, n) + threadIdx.x; e < end; e += kSlotThreads) {
        const double x = static_cast<double>(grads[e]), w = static_cast<double>(params[e]);
        bad += std::isfinite(x) ? 0.0 : 1.0;
        g2 += x * x;
        p2 += w * w;
      }
    }
    g2 = reduce::block_sum(g2, scratch);
    d2 = reduce::block_sum(d2, scratch);
    p2 = reduce::block_sum(p2, scratch);
    bad = reduce::block_sum(bad, scratch);
    if (threadIdx.x == 0) {
      double* r = partials + 4 * row;
      r[0] = g2;
      r[1] = d2;
      r[2] = p2;
      r[3] = bad;
    }
  }
}

// Launch 2: slot blockIdx.x adds its partial rows in tile order.
__global__ void __launch_bounds__(kSlotThreads)
    slot_sums_kernel(const double* __restrict__ partials, int64_t capacity,
                     const int64_t* __restrict__ ranges, int64_t chunks, double* __restrict__ out) {
  __shared__ double scratch[32];
  __shared__ long long offset_scratch[32];
  const int64_t slot = blockIdx.x;
  long long offset = 0;  // the tiles of the slots before this one
  for (int64_t j = threadIdx.x; j < slot; j += kSlotThreads)
    offset += slot_span(ranges, j, chunks).tiles;
  offset = reduce::block_sum(offset, offset_scratch);
  const SlotSpan s = slot_span(ranges, slot, chunks);
  const int64_t end = std::min<int64_t>(offset + s.tiles, capacity);
  double g2 = 0.0, d2 = 0.0, p2 = 0.0, bad = 0.0;
  for (int64_t r = offset + threadIdx.x; r < end; r += kSlotThreads) {
    g2 += partials[4 * r];
    d2 += partials[4 * r + 1];
    p2 += partials[4 * r + 2];
    bad += partials[4 * r + 3];
  }
  g2 = reduce::block_sum(g2, scratch);
  d2 = reduce::block_sum(d2, scratch);
  p2 = reduce::block_sum(p2, scratch);
  bad = reduce::block_sum(bad, scratch);
  if (threadIdx.x == 0) {
    out[3 * slot] = bad > 0.0 ? INFINITY : g2;
    out[3 * slot + 1] = d2;
    out[3 * slot + 2] = p2;
  }
}

}  // namespace

void step_sums_per_slot(const Tensor& step_sums, const Tensor& slot_chunks, const Tensor& grads,
                        const Tensor& params, const Tensor& state, const Tensor& out) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  const int64_t n = params.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t slots = slot_chunks.size(0);
  const int64_t tiles = std::max<int64_t>((chunks + kTileChunks - 1) / kTileChunks, 1);
  const int64_t capacity = tiles + slots;
  const Tensor partials = empty({capacity, 4}, DType::f64, state.device());
  const cudaStream_t stream = dev::stream_for(device);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    tile_sums_kernel<T><<<static_cast<unsigned>(tiles), kSlotThreads, 0, stream>>>(
        step_sums.data<double>(), slot_chunks.data<int64_t>(), slots, chunks, grads.data<T>(),
        params.data<T>(), n, state.data<double>(), partials.data<double>(), capacity);
    ACCRUE_LAUNCH_CHECK();
  };
  if (params.dtype() == DType::f64) {
    launch(double{});
  } else {
    launch(float{});
  }
  slot_sums_kernel<<<static_cast<unsigned>(slots), kSlotThreads, 0, stream>>>(
      partials.data<double>(), capacity, slot_chunks.data<int64_t>(), chunks, out.data<double>());
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
