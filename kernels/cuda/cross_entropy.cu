// CUDA cross-entropy kernels, forward and backward.
//
// Every reduction runs in a fixed order (warp shuffles and shared memory in a
// fixed tree, the rows' losses added in a fixed order): no float atomics, so
// the same inputs give the same bits on every run (Note [Determinism]).
// 16-bit inputs compute in fp32, f64 in f64.
#include <cmath>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"
#include "accrue/kernels/cuda/block_reduce.cuh"
#include "accrue/kernels/cuda/nn_util.cuh"

namespace accrue::kernels::cuda {

namespace {

using namespace reduce;  // exp_, log_, load, block_sum, loss_total_kernel

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

}  // namespace

// ---- the backend functions -------------------------------------------------------------

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
      loss_total_kernel<I, A><<<1, 1024, 0, stream>>>(
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

}  // namespace accrue::kernels::cuda
