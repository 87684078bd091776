// CUDA embedding kernels: the forward row gather, the deterministic backward
// (Note [Deterministic embedding backward]) and the index range count.
//
// No float atomics: the same inputs give the same bits on every run
// (Note [Determinism]). 16-bit gradients sum in fp32, f64 in f64.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"

namespace accrue::kernels::cuda {

namespace {

using namespace reduce;  // load, block_sum

// ---- embedding -------------------------------------------------------------------

// Rows are copied in chunks of the widest unsigned type the row size and both
// base addresses allow (16 bytes for most shapes).
template <class Chunk, class I>
__global__ void embedding_kernel(const Chunk* __restrict__ weight, const I* __restrict__ indices,
                                 int64_t n, int64_t vocab, int64_t chunks_per_row,
                                 Chunk* __restrict__ out) {
  const int64_t total = n * chunks_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row, c = i - row * chunks_per_row;
    const int64_t index = static_cast<int64_t>(indices[row]);
    if (index >= 0 && index < vocab) {
      out[i] = weight[index * chunks_per_row + c];
    } else {
      // Only reachable with index checks off: all-ones bytes are NaN in every
      // float dtype, so the bad row is visible instead of a wild read.
      Chunk nan;
      memset(&nan, 0xff, sizeof(nan));
      out[i] = nan;
    }
  }
}

template <class F>
void visit_chunk(size_t bytes, F&& f) {
  switch (bytes) {
    case 16:
      return f(uint4{});
    case 8:
      return f(uint2{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint16_t{});
  }
}

// ---- embedding backward -------------------------------------------------------------

// (key, position) pairs for the sort; keys out of [0, vocab) (possible only
// with index checks off) become vocab, sort last and are skipped.
template <class I>
__global__ void embedding_sort_pairs_kernel(const I* __restrict__ indices, int64_t n, int64_t vocab,
                                            int32_t* __restrict__ keys,
                                            int32_t* __restrict__ positions) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t index = static_cast<int64_t>(indices[i]);
    keys[i] = static_cast<int32_t>(index >= 0 && index < vocab ? index : vocab);
    positions[i] = static_cast<int32_t>(i);
  }
}

// Note [Deterministic embedding backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The indices are radix-sorted with their positions; the sort is stable, so
// within one index the positions stay increasing. Each warp takes one sorted
// position and one tile of 32 columns; a warp whose position starts a run of
// equal keys sums that run's gradient rows in position order (one column per
// lane) and writes (=) or adds (+=) the weight-gradient row once. The others
// exit at once. No atomics: a row's sum has one owner and one order.
//
// A hot index (padding, frequent tokens) makes a long run that one warp walks
// alone, so the walk is kept latency-friendly: the run's end is found 32 keys
// per step with a ballot, and positions are loaded 32 at a time and broadcast
// by shuffles, leaving the gradient loads independent of each other.
constexpr int kRunsPerBlock = 4;

template <class G, class W, class A>
__global__ void embedding_backward_kernel(const G* __restrict__ grad,
                                          const int32_t* __restrict__ sorted_keys,
                                          const int32_t* __restrict__ sorted_positions, int64_t n,
                                          int64_t d, int64_t vocab, W* __restrict__ grad_weight,
                                          bool accumulate) {
  // Every condition before the shuffles is uniform over the warp (one warp per threadIdx.y).
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRunsPerBlock + threadIdx.y;
  if (i >= n) return;
  const int32_t key = sorted_keys[i];
  if (key >= vocab || (i > 0 && sorted_keys[i - 1] == key)) return;
  const int lane = threadIdx.x;
  int64_t end = i;
  for (;;) {
    const int64_t j = end + lane;
    // Sorted keys: the lanes still inside the run form a prefix of the warp.
    const unsigned inside = __ballot_sync(0xffffffffu, j < n && sorted_keys[j] == key);
    if (inside != 0xffffffffu) {
      end += __ffs(~inside) - 1;
      break;
    }
    end += 32;
  }
  const int64_t c = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool active = c < d;  // lanes past the row still take part in the shuffles
  A acc = 0;
  for (int64_t base = i; base < end; base += 32) {
    const int count = static_cast<int>(end - base < 32 ? end - base : 32);
    const int32_t my_position = lane < count ? sorted_positions[base + lane] : 0;
#pragma unroll 8
    for (int k = 0; k < count; ++k) {
      const int64_t position = __shfl_sync(0xffffffffu, my_position, k);
      if (active) acc += load<A>(grad[position * d + c]);
    }
  }
  if (!active) return;
  W& o = grad_weight[static_cast<int64_t>(key) * d + c];
  o = cu::convert<W>(accumulate ? load<A>(o) + acc : acc);
}

// ---- count_out_of_range --------------------------------------------------------------

// Integer counts: the block totals are combined with an integer atomic, which
// is exact in any order (the no-atomics rule is for floats).
template <class I>
__global__ void count_out_of_range_kernel(const I* __restrict__ indices, int64_t n, int64_t bound,
                                          int64_t ignore_index, bool use_ignore,
                                          unsigned long long* count) {
  __shared__ long long scratch[32];
  long long bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(indices[i]);
    bad += !(use_ignore && v == ignore_index) && (v < 0 || v >= bound);
  }
  bad = block_sum(bad, scratch);
  if (threadIdx.x == 0 && bad != 0) atomicAdd(count, static_cast<unsigned long long>(bad));
}

}  // namespace

// ---- the backend functions -------------------------------------------------------------

void embedding(const Tensor& weight, const Tensor& indices_in, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const Tensor indices = indices_in.contiguous();
  const int64_t n = indices.numel(), vocab = weight.size(0);
  const size_t row_bytes = static_cast<size_t>(weight.size(1)) * element_size(weight.dtype());
  if (n == 0 || row_bytes == 0) return;
  size_t chunk = 16;
  const auto w_address = reinterpret_cast<uintptr_t>(weight.data_ptr());
  const auto o_address = reinterpret_cast<uintptr_t>(out.data_ptr());
  while (chunk > element_size(weight.dtype()) &&
         (row_bytes % chunk != 0 || w_address % chunk != 0 || o_address % chunk != 0))
    chunk /= 2;
  const int64_t chunks_per_row = static_cast<int64_t>(row_bytes / chunk);
  visit_chunk(chunk, [&](auto chunk_tag) {
    using Chunk = decltype(chunk_tag);
    visit_index_dtype(indices.dtype(), "embedding", [&](auto index_tag) {
      using I = decltype(index_tag);
      embedding_kernel<Chunk, I>
          <<<cu::grid_for(n * chunks_per_row, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const Chunk*>(weight.data_ptr()),
              static_cast<const I*>(indices.data_ptr()), n, vocab, chunks_per_row,
              static_cast<Chunk*>(out.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

int64_t count_out_of_range(const Tensor& indices_in, int64_t bound, int64_t ignore_index,
                           bool use_ignore) {
  const int dev = indices_in.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const Tensor indices = indices_in.contiguous();
  const int64_t n = indices.numel();
  if (n == 0) return 0;
  Tensor count = empty({1}, DType::i64, Device::cuda(dev));
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(count.data_ptr(), 0, sizeof(int64_t), stream));
  visit_index_dtype(indices.dtype(), "count_out_of_range", [&](auto tag) {
    using I = decltype(tag);
    count_out_of_range_kernel<I><<<cu::grid_for(n, kThreads, 1024), kThreads, 0, stream>>>(
        static_cast<const I*>(indices.data_ptr()), n, bound, ignore_index, use_ignore,
        static_cast<unsigned long long*>(count.data_ptr()));
    ACCRUE_LAUNCH_CHECK();
  });
  int64_t host = 0;
  ACCRUE_CUDA_CHECK(
      cudaMemcpyAsync(&host, count.data_ptr(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  ACCRUE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void embedding_backward(const Tensor& grad, const Tensor& indices_in, const Tensor& grad_weight,
                        bool accumulate) {
  const int dev = grad_weight.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const Tensor indices = indices_in.contiguous();
  const int64_t n = grad.size(0), d = grad.size(1), vocab = grad_weight.size(0);
  // Rows no index hits must read 0 when overwriting (Note [Overwrite first]).
  if (!accumulate)
    ACCRUE_CUDA_CHECK(cudaMemsetAsync(grad_weight.data_ptr(), 0, grad_weight.nbytes(), stream));
  if (n == 0 || d == 0) return;
  ACCRUE_CHECK(
      n <= std::numeric_limits<int32_t>::max() && vocab < std::numeric_limits<int32_t>::max(),
      "embedding_backward: ", n, " indices into ", vocab, " rows exceed the 32-bit sort keys");
  ACCRUE_CHECK((d + 31) / 32 <= 65535, "embedding_backward: row size ", d, " is too large");

  // Stable radix sort of (index, position); only the bits that can differ are sorted.
  const Device device = Device::cuda(dev);
  Tensor keys = empty({2, n}, DType::i32, device);
  Tensor positions = empty({2, n}, DType::i32, device);
  int32_t* keys_in = keys.data<int32_t>();
  int32_t* keys_out = keys_in + n;
  int32_t* positions_in = positions.data<int32_t>();
  int32_t* positions_out = positions_in + n;
  visit_index_dtype(indices.dtype(), "embedding_backward", [&](auto tag) {
    using I = decltype(tag);
    embedding_sort_pairs_kernel<I><<<cu::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const I*>(indices.data_ptr()), n, vocab, keys_in, positions_in);
    ACCRUE_LAUNCH_CHECK();
  });
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<uint32_t>(vocab))));
  const int num_items = static_cast<int>(n);
  size_t temp_bytes = 0;
  ACCRUE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                    positions_in, positions_out, num_items, 0,
                                                    end_bit, stream));
  Tensor temp =
      empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::boolean, device);
  ACCRUE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys_out,
                                                    positions_in, positions_out, num_items, 0,
                                                    end_bit, stream));

  // See Note [Deterministic embedding backward].
  const dim3 block(32, kRunsPerBlock);
  const dim3 grid(static_cast<unsigned>((n + kRunsPerBlock - 1) / kRunsPerBlock),
                  static_cast<unsigned>((d + 31) / 32));
  cu::visit_float_dtype(grad.dtype(), "embedding_backward", [&](auto g_tag) {
    using G = decltype(g_tag);
    visit_grad_dtype<G>(grad_weight.dtype(), "embedding_backward", [&](auto w_tag) {
      using W = decltype(w_tag);
      using A =
          std::conditional_t<std::is_same_v<G, double> || std::is_same_v<W, double>, double, float>;
      embedding_backward_kernel<G, W, A><<<grid, block, 0, stream>>>(
          static_cast<const G*>(grad.data_ptr()), keys_out, positions_out, n, d, vocab,
          static_cast<W*>(grad_weight.data_ptr()), accumulate);
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

}  // namespace accrue::kernels::cuda
