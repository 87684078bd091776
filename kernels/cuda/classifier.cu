// CUDA kernels of the fused classifier (Note [Fused classifier]): the per-row
// log-sum-exp that overwrites a chunk's logits with softmax - onehot, the
// fixed-order loss total, and the seed scaling of backward.
//
// Like the cross-entropy kernels of kernels/cuda/nn.cu, every reduction runs
// in a fixed order (warp shuffles in a fixed lane order, then the warps in
// order; the row losses added by one block in row order): no float atomics,
// so the same inputs give the same bits on every run. 16-bit inputs compute
// in fp32, f64 in f64. Everything launches on the current stream and nothing
// synchronizes the host.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/cuda_types.cuh"
#include "kernels/classifier_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

__device__ __forceinline__ float exp_(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_(double x) {
  return exp(x);
}
__device__ __forceinline__ float log_(float x) {
  return logf(x);
}
__device__ __forceinline__ double log_(double x) {
  return log(x);
}

template <class A, class T>
__device__ __forceinline__ A load(T v) {
  return cu::convert<A>(v);
}

// Butterfly sum over a warp; every lane ends with the same bits (each step
// adds the same two partials, only in swapped operand order, which is exact).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a block whose size is a multiple of 32, in a fixed order, returned
// to every thread. `scratch` is shared memory of at least 32 elements.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : T(0);
  return warp_sum(v);
}

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
  } else if (x != static_cast<A>(-INFINITY)) {
    r.sum += exp_(x - r.max);  // a NaN x propagates here
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
    const MaxSum<A> o{__shfl_xor_sync(0xffffffffu, v.max, offset),
                      __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    // The lower lane's partial always goes first, so every lane gets the same bits.
    v = (threadIdx.x & offset) ? max_sum_merge(o, v) : max_sum_merge(v, o);
  }
  return v;
}

// log(sum(exp(row[0, cols)))) over a block, returned to every thread. Every
// read of `row` happens before the block's barrier inside: after this
// returns, any thread may overwrite the row.
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

// One block per row of a chunk: row_loss[r] = lse(x[0, valid)) - x[t], then
// the row becomes softmax - onehot over [0, valid) and 0 over [valid, cols).
// An ignored row becomes 0 with loss 0.
template <class T, class I, class A>
__global__ void classifier_rows_kernel(T* __restrict__ logits, const I* __restrict__ targets,
                                       int64_t cols, int64_t valid, int64_t ignore_index,
                                       A* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  T* row = logits + r * cols;
  if (t == ignore_index) {  // uniform over the block: no thread reaches a barrier
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      row[c] = cu::convert<T>(A(0));
    if (threadIdx.x == 0) row_loss[r] = A(0);
    return;
  }
  if (t < 0 || t >= valid) {  // only with index checks off: make the bad row visible
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      row[c] = cu::convert<T>(c < valid ? static_cast<A>(NAN) : A(0));
    if (threadIdx.x == 0) row_loss[r] = static_cast<A>(NAN);
    return;
  }
  // Read before block_log_sum_exp's barrier, hence before any thread overwrites it.
  const A target_logit = threadIdx.x == 0 ? load<A>(row[t]) : A(0);
  const A lse = block_log_sum_exp<T, A>(row, valid);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    A d = A(0);
    if (c < valid) {
      const A p = exp_(load<A>(row[c]) - lse);
      d = c == t ? p - A(1) : p;
    }
    row[c] = cu::convert<T>(d);
  }
  if (threadIdx.x == 0) row_loss[r] = lse - target_logit;
}

// One block: sum = the row losses, count = #(targets != ignore_index), both in
// a fixed order (each thread a fixed stride of rows, then the block tree).
template <class I, class A>
__global__ void classifier_total_kernel(const A* __restrict__ row_loss,
                                        const I* __restrict__ targets, int64_t rows,
                                        int64_t ignore_index, A* __restrict__ sum,
                                        int64_t* __restrict__ count) {
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
    *sum = loss;
    *count = counted;
  }
}

// out = x * seed in A, rounded once; seed is read on the device. x may be out
// itself (each element is read, then written, by one thread): no __restrict__.
template <class X, class T, class A>
__global__ void scale_by_seed_kernel(const X* x, const A* __restrict__ seed, int64_t n, T* out) {
  const A g = *seed;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cu::convert<T>(load<A>(x[i]) * g);
}

// Threads for one block per row of `cols` elements: about eight elements per
// thread, between one warp and 512 threads (a multiple of 32, as block_sum needs).
int row_threads(int64_t cols) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{8} < cols)
    threads *= 2;
  return threads;
}

void check_dtype(const Tensor& t, DType expected, const char* op, const char* what) {
  ACCRUE_CHECK(t.dtype() == expected, op, ": ", what, " has dtype ", dtype_name(t.dtype()),
               "; expected ", dtype_name(expected));
}

constexpr int kThreads = 256;

}  // namespace

void classifier_rows(const Tensor& logits, const Tensor& targets, int64_t valid_classes,
                     int64_t ignore_index, const Tensor& row_loss) {
  const int dev = logits.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  ACCRUE_CHECK(rows <= std::numeric_limits<int32_t>::max(), "classifier_rows: ", rows,
               " rows exceed the CUDA grid limit");
  cu::visit_float_dtype(logits.dtype(), "classifier_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    check_dtype(row_loss, std::is_same_v<A, double> ? DType::f64 : DType::f32, "classifier_rows",
                "row_loss");
    visit_index_dtype(targets.dtype(), "classifier_rows", [&](auto index_tag) {
      using I = decltype(index_tag);
      classifier_rows_kernel<T, I, A>
          <<<static_cast<unsigned>(rows), row_threads(cols), 0, cu::stream_for(dev)>>>(
              static_cast<T*>(logits.data_ptr()), static_cast<const I*>(targets.data_ptr()), cols,
              valid_classes, ignore_index, static_cast<A*>(row_loss.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void classifier_total(const Tensor& row_loss, const Tensor& targets, int64_t ignore_index,
                      const Tensor& sum, const Tensor& count) {
  const int dev = row_loss.device().index;
  cu::DeviceScope scope(dev);
  check_dtype(sum, row_loss.dtype(), "classifier_total", "sum");
  check_dtype(count, DType::i64, "classifier_total", "count");
  const int64_t rows = row_loss.numel();
  auto launch = [&](auto loss_tag) {
    using A = decltype(loss_tag);
    visit_index_dtype(targets.dtype(), "classifier_total", [&](auto index_tag) {
      using I = decltype(index_tag);
      classifier_total_kernel<I, A><<<1, 1024, 0, cu::stream_for(dev)>>>(
          static_cast<const A*>(row_loss.data_ptr()), static_cast<const I*>(targets.data_ptr()),
          rows, ignore_index, static_cast<A*>(sum.data_ptr()),
          static_cast<int64_t*>(count.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    });
  };
  if (row_loss.dtype() == DType::f64) {
    launch(double{});
  } else {
    check_dtype(row_loss, DType::f32, "classifier_total", "row_loss");
    launch(float{});
  }
}

void scale_by_seed(const Tensor& x, const Tensor& seed, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t n = out.numel();
  cu::visit_float_dtype(out.dtype(), "scale_by_seed", [&](auto tag) {
    using T = decltype(tag);
    using A = cu::math_t<T>;
    check_dtype(seed, std::is_same_v<A, double> ? DType::f64 : DType::f32, "scale_by_seed", "seed");
    auto launch = [&](auto x_tag) {
      using X = decltype(x_tag);
      scale_by_seed_kernel<X, T, A>
          <<<cu::grid_for(n, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
              static_cast<const X*>(x.data_ptr()), static_cast<const A*>(seed.data_ptr()), n,
              static_cast<T*>(out.data_ptr()));
      ACCRUE_LAUNCH_CHECK();
    };
    if (x.dtype() == out.dtype()) {
      launch(T{});
    } else {
      check_dtype(x, DType::f32, "scale_by_seed", "x");
      launch(float{});
    }
  });
}

}  // namespace accrue::kernels::cuda
