// CUDA reduce_last: sum, mean, max and argmax over the last dim, in the order
// of Note [Fixed reduction order] (kernels/cuda/row_reduce.cuh). Column sums:
// kernels/cuda/sum_rows.cu; softmax: kernels/cuda/softmax.cu.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/row_reduce.cuh"

namespace accrue::kernels::cuda {
namespace {

// The least work worth a block of its own when one row is split across blocks.
constexpr int64_t kMinChunk = 16384;

template <class M>
struct ArgMaxAcc {
  M value;
  int64_t index;
};

template <class M>
__device__ __forceinline__ ArgMaxAcc<M> shfl_xor(ArgMaxAcc<M> a, int m) {
  return {shfl_xor(a.value, m), shfl_xor(a.index, m)};
}

// ---- reducers: what reduce_last folds ---------------------------------------------------
//
// The reducer contract: kernels/cuda/row_reduce.cuh.

template <class T>
struct SumReducer {
  using M = dev::math_t<T>;
  using A = M;
  using Out = T;
  __device__ static A identity() { return A(0); }
  __device__ static A step(A acc, int64_t, T x) { return acc + dev::convert<M>(x); }
  __device__ static A combine(A a, A b) { return a + b; }
  __device__ static Out finalize(A acc, int64_t cols, bool mean) {
    return dev::convert<T>(mean ? acc / static_cast<A>(cols) : acc);
  }
};

// NaN wins: the maximum of a row holding a NaN is NaN.
template <class T>
struct MaxReducer {
  using M = dev::math_t<T>;
  using A = M;
  using Out = T;
  __device__ static A identity() { return negative_infinity<M>(); }
  __device__ static A combine(A a, A b) { return (a != a || a > b) ? a : b; }
  __device__ static A step(A acc, int64_t, T x) { return combine(acc, dev::convert<M>(x)); }
  __device__ static Out finalize(A acc, int64_t, bool) { return dev::convert<T>(acc); }
};

// The index of the first maximum; NaN counts as larger than any number (so the
// first NaN wins), which makes (value, index) a total order and combine symmetric.
template <class T>
struct ArgMaxReducer {
  using M = dev::math_t<T>;
  using A = ArgMaxAcc<M>;
  using Out = int64_t;
  __device__ static A identity() {
    return {negative_infinity<M>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ static A combine(A a, A b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.index <= b.index ? a : b;
  }
  __device__ static A step(A acc, int64_t index, T x) {
    return combine(acc, A{dev::convert<M>(x), index});
  }
  __device__ static Out finalize(A acc, int64_t, bool) { return acc.index; }
};

// ---- reduce_last ------------------------------------------------------------------------------

// One warp per row (kWarp, kWarps rows per block), or one block per row.
// Without partials a group finalizes its row into out; with partials (the split
// scheme) block (row, chunk) covers columns [chunk * chunk_len, ...) and stores
// its accumulator at partials[row * chunks + chunk].
template <class R, int V, bool kWarp, class T>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(const T* in, int64_t rows, int64_t cols, int64_t chunk_len, bool mean,
                       typename R::Out* out, typename R::A* partials) {
  __shared__ typename R::A smem[kWarps];
  const RowGroup<kWarp> g;
  if (kWarp && g.row >= rows) return;  // a whole warp leaves; warps never sync with each other
  const int64_t begin = kWarp ? 0 : blockIdx.y * chunk_len;
  const int64_t end = kWarp ? cols : std::min(cols, begin + chunk_len);
  typename R::A acc = fold_segment<R, V>(R::identity(), begin, end - begin, g.t, g.nthreads,
                                         in + g.row * cols + begin);
  acc = group_allreduce<R, kWarp>(acc, smem);
  if (g.t != 0) return;
  if (partials != nullptr) {
    partials[g.row * gridDim.y + blockIdx.y] = acc;
  } else {
    out[g.row] = R::finalize(acc, cols, mean);
  }
}

// The second pass of the split scheme: one block per row folds its chunks' partials in order.
template <class R>
__global__ void __launch_bounds__(kThreads)
    reduce_partials_kernel(const typename R::A* partials, int64_t chunks, int64_t cols, bool mean,
                           typename R::Out* out) {
  __shared__ typename R::A smem[kWarps];
  const int64_t row = blockIdx.x;
  typename R::A acc = R::identity();
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
    acc = R::combine(acc, partials[row * chunks + c]);
  acc = block_allreduce<R>(acc, smem);
  if (threadIdx.x == 0) out[row] = R::finalize(acc, cols, mean);
}

template <class R, class T>
void reduce_last_typed(const Tensor& in, const Tensor& out, bool mean) {
  using A = typename R::A;
  using Out = typename R::Out;
  constexpr int V = 16 / sizeof(T);
  // [rows, 0] has no columns to count rows by: the output has one element per row.
  const int64_t cols = in.dim() == 0 ? 1 : in.shape().back();
  const int64_t rows = cols == 0 ? out.numel() : in.numel() / cols;
  if (rows == 0) return;
  const int device = in.device().index;
  cudaStream_t stream = dev::stream_for(device);
  const T* x = static_cast<const T*>(in.data_ptr());
  Out* y = static_cast<Out*>(out.data_ptr());

  if (cols <= kWarpRowMaxCols) {
    reduce_rows_kernel<R, V, true, T>
        <<<checked_grid((rows + kWarps - 1) / kWarps, "reduce"), kThreads, 0, stream>>>(
            x, rows, cols, cols, mean, y, nullptr);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  // Long rows: one block per row, unless there are too few rows to fill the GPU;
  // then each row is split into chunks so that rows x chunks is about one wave.
  auto* kernel = reduce_rows_kernel<R, V, false, T>;
  int64_t chunks = 1;
  const int64_t max_chunks = (cols + kMinChunk - 1) / kMinChunk;
  if (max_chunks > 1) {
    const int64_t wave = blocks_per_wave(reinterpret_cast<const void*>(kernel), kThreads, device);
    if (rows < wave) chunks = std::min({max_chunks, wave / rows, int64_t{65535}});
  }
  // Chunks start at multiples of V, so an aligned row gives aligned chunks.
  int64_t chunk_len = (cols + chunks - 1) / chunks;
  chunk_len = (chunk_len + V - 1) / V * V;
  chunks = (cols + chunk_len - 1) / chunk_len;
  const dim3 grid(checked_grid(rows, "reduce"), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    kernel<<<grid, kThreads, 0, stream>>>(x, rows, cols, chunk_len, mean, y, nullptr);
    ACCRUE_LAUNCH_CHECK();
    return;
  }
  const Tensor partials = scratch(rows * chunks * static_cast<int64_t>(sizeof(A)), in.device());
  A* p = static_cast<A*>(partials.data_ptr());
  kernel<<<grid, kThreads, 0, stream>>>(x, rows, cols, chunk_len, mean, y, p);
  ACCRUE_LAUNCH_CHECK();
  reduce_partials_kernel<R><<<grid.x, kThreads, 0, stream>>>(p, chunks, cols, mean, y);
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace

void reduce_last(ReduceOp op, const Tensor& in, const Tensor& out) {
  dev::DeviceScope scope(in.device().index);
  dev::visit_float_dtype(in.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::Sum:
        return reduce_last_typed<SumReducer<T>, T>(in, out, false);
      case ReduceOp::Mean:
        return reduce_last_typed<SumReducer<T>, T>(in, out, true);
      case ReduceOp::Max:
        return reduce_last_typed<MaxReducer<T>, T>(in, out, false);
      case ReduceOp::ArgMax:
        return reduce_last_typed<ArgMaxReducer<T>, T>(in, out, false);
    }
  });
}

}  // namespace accrue::kernels::cuda
