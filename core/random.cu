// CUDA half of the random draws: one thread per element, the same function as the CPU.
#include "accrue/core/cuda_types.cuh"
#include "accrue/core/random_draw.h"

namespace accrue::detail {

namespace {

template <class D>
__global__ void draw_kernel(D* out, DrawSpec spec, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = draw_element(spec, i, std::is_same_v<D, double>);
    // Narrow through float exactly as the CPU's from_double does for float dtypes.
    if constexpr (std::is_same_v<D, double> || std::is_integral_v<D>) {
      out[i] = static_cast<D>(v);
    } else {
      out[i] = cuda::convert<D>(static_cast<float>(v));
    }
  }
}

}  // namespace

void draw_cuda(const Tensor& out, const DrawSpec& spec) {
  const int dev = out.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = out.numel();
  cuda::visit_device_dtype(out.dtype(), [&](auto d) {
    using D = decltype(d);
    if constexpr (!std::is_same_v<D, bool>) {
      draw_kernel<D><<<cuda::grid_for(n, 256), 256, 0, cuda::stream_for(dev)>>>(
          static_cast<D*>(out.data_ptr()), spec, n);
      ACCRUE_LAUNCH_CHECK();
    }
  });
}

}  // namespace accrue::detail
