// CUDA dropout: one thread per pair of elements, the pair's one Philox block
// shared by both (Note [Dropout threshold], kernels/dropout_backend.h), so the
// mask is bit-identical to the CPU reference's.
#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/dropout_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

template <class T>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n,
                               DropoutMask mask, cu::math_t<T> scale) {
  using M = cu::math_t<T>;
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bool keep_even, keep_odd;
    dropout_keep_pair(mask.seed, mask.offset, j, mask.threshold, &keep_even, &keep_odd);
    const int64_t i = 2 * j;
    out[i] = keep_even ? cu::convert<T>(cu::convert<M>(in[i]) * scale) : cu::convert<T>(M(0));
    if (i + 1 < n)
      out[i + 1] =
          keep_odd ? cu::convert<T>(cu::convert<M>(in[i + 1]) * scale) : cu::convert<T>(M(0));
  }
}

constexpr int kThreads = 256;

}  // namespace

void dropout(const Tensor& in, const DropoutMask& mask, const Tensor& out) {
  const int dev = out.device().index;
  cu::DeviceScope scope(dev);
  const int64_t n = in.numel();
  if (n == 0) return;
  cu::visit_float_dtype(in.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using M = cu::math_t<T>;
    dropout_kernel<T><<<cu::grid_for((n + 1) / 2, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
        static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), n, mask,
        static_cast<M>(mask.scale));
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::kernels::cuda
