// CUDA neural-network kernels: embedding, cross-entropy and layer norm,
// forward and backward.
//
// Every reduction runs in a fixed order (warp shuffles and shared memory in a
// fixed tree, per-block partial sums added in block order): no float atomics,
// so the same inputs give the same bits on every run (Note [Determinism]).
// 16-bit inputs compute in fp32, f64 in f64.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/cuda_types.cuh"
#include "kernels/backend.h"
#include "kernels/cuda/block_reduce.cuh"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

// ---- shared device helpers ----------------------------------------------------

using namespace reduce;  // exp_, log_, sqrt_, load, warp_sum, block_sum

// Threads for a kernel with one block per row of `cols` elements: about eight
// elements per thread, between one warp and 512 threads.
int row_threads(int64_t cols) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{8} < cols)
    threads *= 2;
  return threads;
}

void check_grid_x(int64_t blocks, const char* op) {
  ACCRUE_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": ", blocks,
               " rows exceed the CUDA grid limit");
}

// Calls f(Out{}) for a gradient output that is f32 or the input's dtype
// (Note [Fused weight-gradient accumulation]: fp32 arena slots).
template <class In, class F>
void visit_grad_dtype(DType out, const char* op, F&& f) {
  cu::visit_float_dtype(out, op, [&](auto tag) {
    using Out = decltype(tag);
    if constexpr (std::is_same_v<Out, In> || std::is_same_v<Out, float>) {
      f(Out{});
    } else {
      ACCRUE_FAIL(op, ": a gradient of dtype ", dtype_name(out), " must be f32 or the input's ",
                  "dtype");
    }
  });
}

// The floating dtype sums are kept in: f64 for f64, f32 otherwise.
DType accumulate_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// t itself when it is already contiguous and of dtype d (or undefined), else a
// converted contiguous copy (a small device copy: no host synchronization).
Tensor as_dtype(const Tensor& t, DType d) {
  if (!t.defined()) return t;
  return t.dtype() == d ? t.contiguous() : t.to(d).contiguous();
}

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

// ---- cross-entropy ---------------------------------------------------------------

// The running (max, sum of exp(x - max)) of a row: the online log-sum-exp.
template <class A>
struct MaxSum {
  A max;
  A sum;
};

template <class A>
__device__ __forceinline__ MaxSum<A> max_sum_add(MaxSum<A> r, A x) {
  if (x > r.max) {
    r.sum = r.sum * exp_(r.max - x) + A(1);  // exp(-inf) = 0 for the first element
    r.max = x;
  } else if (r.max != static_cast<A>(-INFINITY)) {
    r.sum += exp_(x - r.max);  // NaN x propagates here
  }
  return r;
}

template <class A>
__device__ __forceinline__ MaxSum<A> max_sum_merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.max > b.max ? a.max : b.max;
  if (m == static_cast<A>(-INFINITY)) return {m, a.sum + b.sum};
  return {m, a.sum * exp_(a.max - m) + b.sum * exp_(b.max - m)};
}

template <class A>
__device__ __forceinline__ MaxSum<A> warp_max_sum(MaxSum<A> v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum<A> o{__shfl_xor_sync(0xffffffffu, v.max, offset),
                __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    // Lanes combine in a fixed (lower lane first) order so all end with the same bits.
    v = (threadIdx.x & offset) ? max_sum_merge(o, v) : max_sum_merge(v, o);
  }
  return v;
}

// log(sum(exp(row))) over a block, returned to every thread.
template <class T, class A>
__device__ A block_log_sum_exp(const T* row, int64_t cols) {
  __shared__ A scratch_max[32], scratch_sum[32];
  MaxSum<A> r{static_cast<A>(-INFINITY), A(0)};
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    r = max_sum_add(r, load<A>(row[c]));
  r = warp_max_sum(r);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    scratch_max[warp] = r.max;
    scratch_sum[warp] = r.sum;
  }
  __syncthreads();
  r = lane < static_cast<int>(blockDim.x >> 5) ? MaxSum<A>{scratch_max[lane], scratch_sum[lane]}
                                               : MaxSum<A>{static_cast<A>(-INFINITY), A(0)};
  r = warp_max_sum(r);
  return r.max + log_(r.sum);
}

// One block per row: row_loss[r] = lse(x) - x[t], 0 for an ignored row.
template <class T, class I, class A>
__global__ void cross_entropy_rows_kernel(const T* __restrict__ logits,
                                          const I* __restrict__ targets, int64_t cols,
                                          int64_t ignore_index, A* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) row_loss[r] = A(0);
    return;
  }
  const T* row = logits + r * cols;
  const A lse = block_log_sum_exp<T, A>(row, cols);
  if (threadIdx.x == 0) {
    // A target out of [0, C) only gets here with index checks off: NaN, not a wild read.
    row_loss[r] = (t >= 0 && t < cols) ? lse - load<A>(row[t]) : static_cast<A>(NAN);
  }
}

// One block: loss_sum = sum(row_loss), count = #(targets != ignore_index), both
// in a fixed order (each thread a fixed stride of rows, then the block tree).
template <class I, class A>
__global__ void cross_entropy_total_kernel(const A* __restrict__ row_loss,
                                           const I* __restrict__ targets, int64_t rows,
                                           int64_t ignore_index, A* loss_sum, int64_t* count) {
  __shared__ A scratch_loss[32];
  __shared__ long long scratch_count[32];
  A loss = 0;
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    loss += row_loss[r];
    counted += static_cast<int64_t>(targets[r]) != ignore_index;
  }
  loss = block_sum(loss, scratch_loss);
  counted = block_sum(counted, scratch_count);
  if (threadIdx.x == 0) {
    *loss_sum = loss;
    *count = counted;
  }
}

// One block per row: grad = g * (softmax(x) - onehot(t)), 0 for an ignored row.
// g is read on the device: no host synchronization.
template <class T, class I, class A>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ logits,
                                              const I* __restrict__ targets, int64_t cols,
                                              int64_t ignore_index, const A* __restrict__ grad_sum,
                                              T* __restrict__ grad) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  const T* row = logits + r * cols;
  T* out = grad + r * cols;
  if (t == ignore_index) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      out[c] = cu::convert<T>(A(0));
    return;
  }
  if (t < 0 || t >= cols) {  // index checks off: make the bad row visible
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      out[c] = cu::convert<T>(static_cast<A>(NAN));
    return;
  }
  const A lse = block_log_sum_exp<T, A>(row, cols);
  const A g = *grad_sum;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A p = exp_(load<A>(row[c]) - lse);
    out[c] = cu::convert<T>(g * (c == t ? p - A(1) : p));
  }
}

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
                                     const A* __restrict__ rstd, int64_t d, T* __restrict__ dx) {
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
    dx[r * d + c] = cu::convert<T>(rs * (gw - mean_gw - xhat * mean_gw_xhat));
  }
}

// Note [Deterministic column sums]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dweight = sum over rows of dy * xhat and dbias = sum over rows of dy are
// column sums over many rows. Pass 1: block (x, y) sums 32 columns over one
// chunk of rows, each thread a fixed stride of the chunk, then the 8 thread
// rows in order, writing partial[chunk][column]. Pass 2: one thread per column
// adds the chunks in order and writes (=) or adds (+=) the result. The order
// depends only on the shape, never on scheduling.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;

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

template <class A, class O>
__global__ void column_total_kernel(const A* __restrict__ partial, int64_t chunks, int64_t d,
                                    O* out, int64_t out_stride, bool accumulate) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= d) return;
  A s = 0;
  for (int64_t k = 0; k < chunks; ++k)
    s += partial[k * d + c];
  O& o = out[c * out_stride];
  o = cu::convert<O>(accumulate ? load<A>(o) + s : s);
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

constexpr int kThreads = 256;

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

void cross_entropy(const Tensor& logits, const Tensor& targets_in, int64_t ignore_index,
                   const Tensor& loss_sum, const Tensor& count) {
  const int dev = logits.device().index;
  cu::DeviceScope scope(dev);
  cudaStream_t stream = cu::stream_for(dev);
  const Tensor targets = targets_in.contiguous();
  const int64_t rows = logits.size(0), cols = logits.size(1);
  check_grid_x(rows, "cross_entropy");
  const DType acc = accumulate_dtype(logits.dtype());
  ACCRUE_CHECK(loss_sum.dtype() == acc && count.dtype() == DType::i64, "cross_entropy: loss_sum ",
               dtype_name(loss_sum.dtype()), " / count ", dtype_name(count.dtype()), " should be ",
               dtype_name(acc), " / i64");
  Tensor row_loss = empty({rows}, acc, Device::cuda(dev));
  cu::visit_float_dtype(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    visit_index_dtype(targets.dtype(), "cross_entropy", [&](auto index_tag) {
      using I = decltype(index_tag);
      const I* t = static_cast<const I*>(targets.data_ptr());
      if (rows > 0) {
        cross_entropy_rows_kernel<T, I, A>
            <<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(
                static_cast<const T*>(logits.data_ptr()), t, cols, ignore_index,
                static_cast<A*>(row_loss.data_ptr()));
        ACCRUE_LAUNCH_CHECK();
      }
      cross_entropy_total_kernel<I, A><<<1, 1024, 0, stream>>>(
          static_cast<const A*>(row_loss.data_ptr()), t, rows, ignore_index,
          static_cast<A*>(loss_sum.data_ptr()), static_cast<int64_t*>(count.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets_in, int64_t ignore_index,
                            const Tensor& grad_sum_in, const Tensor& grad_logits) {
  const int dev = logits.device().index;
  cu::DeviceScope scope(dev);
  const Tensor targets = targets_in.contiguous();
  const int64_t rows = logits.size(0), cols = logits.size(1);
  if (rows == 0 || cols == 0) return;
  check_grid_x(rows, "cross_entropy_backward");
  // The seed stays on the device (a device-side dtype conversion at most).
  const Tensor grad_sum = as_dtype(grad_sum_in, accumulate_dtype(logits.dtype()));
  cu::visit_float_dtype(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    visit_index_dtype(targets.dtype(), "cross_entropy_backward", [&](auto index_tag) {
      using I = decltype(index_tag);
      cross_entropy_backward_kernel<T, I, A>
          <<<static_cast<unsigned>(rows), row_threads(cols), 0, cu::stream_for(dev)>>>(
              static_cast<const T*>(logits.data_ptr()), static_cast<const I*>(targets.data_ptr()),
              cols, ignore_index, static_cast<const A*>(grad_sum.data_ptr()),
              static_cast<T*>(grad_logits.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

namespace {

template <class P>
const P* optional_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.data_ptr()) : nullptr;
}

}  // namespace

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

void layer_norm_backward(const Tensor& grad_in, const Tensor& x, const Tensor& weight_in,
                         const Tensor& mean_in, const Tensor& rstd_in, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias, bool accumulate) {
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
    if (rows > 0 && d > 0) {
      layer_norm_dx_kernel<T, A><<<static_cast<unsigned>(rows), row_threads(d), 0, stream>>>(
          static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
          optional_ptr<T>(weight), static_cast<const A*>(mean.data_ptr()),
          static_cast<const A*>(rstd.data_ptr()), d, static_cast<T*>(dx.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    }
    if ((!dweight.defined() && !dbias.defined()) || d == 0) return;

    // See Note [Deterministic column sums]. About 64 rows per chunk, at most 1024 chunks.
    const int64_t chunks = std::min<int64_t>((rows + 63) / 64, 1024);
    const int64_t rows_per_chunk = chunks == 0 ? 0 : (rows + chunks - 1) / chunks;
    const Device device = Device::cuda(dev);
    Tensor partial_dw = dweight.defined() ? empty({chunks, d}, acc, device) : Tensor();
    Tensor partial_db = dbias.defined() ? empty({chunks, d}, acc, device) : Tensor();
    auto partial_ptr = [](const Tensor& t) {
      return t.defined() ? static_cast<A*>(t.data_ptr()) : nullptr;
    };
    if (chunks > 0) {
      const dim3 grid(static_cast<unsigned>((d + kColumnTile - 1) / kColumnTile),
                      static_cast<unsigned>(chunks));
      layer_norm_param_partials_kernel<T, A><<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
          static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(x.data_ptr()),
          static_cast<const A*>(mean.data_ptr()), static_cast<const A*>(rstd.data_ptr()), rows, d,
          rows_per_chunk, partial_ptr(partial_dw), partial_ptr(partial_db));
      ACCRUE_LAUNCH_CHECK();
    }
    auto finish = [&](const Tensor& partial, const Tensor& target) {
      if (!target.defined()) return;
      visit_grad_dtype<T>(target.dtype(), "layer_norm_backward", [&](auto o_tag) {
        using O = decltype(o_tag);
        column_total_kernel<A, O><<<cu::grid_for(d, kThreads), kThreads, 0, stream>>>(
            static_cast<const A*>(partial.data_ptr()), chunks, d,
            static_cast<O*>(target.data_ptr()), target.stride(0), accumulate);
        ACCRUE_LAUNCH_CHECK();
      });
    };
    finish(partial_dw, dweight);
    finish(partial_db, dbias);
  });
}

}  // namespace accrue::kernels::cuda
