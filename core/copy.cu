// CUDA halves of core's copies: strided copy with cast, fill, arange.
#include "core/copy.h"
#include "core/copy_geometry.h"
#include "core/cuda_types.cuh"
#include "core/strided_index.h"

namespace accrue::detail {

namespace {

template <class D, class S>
__global__ void copy_contiguous_kernel(D* __restrict__ out, const S* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cuda::convert<D>(in[i]);
}

template <class D, class S>
__global__ void copy_strided_kernel(D* out, StridedGeometry gd, const S* in, StridedGeometry gs,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[gd.offset_of(i)] = cuda::convert<D>(in[gs.offset_of(i)]);
}

template <class D>
__global__ void fill_kernel(D* out, StridedGeometry g, D value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[g.offset_of(i)] = value;
}

template <class D>
__global__ void arange_kernel(D* out, double start, double step, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cuda::convert<D>(start + static_cast<double>(i) * step);
}

constexpr int kThreads = 256;

}  // namespace

void copy_cuda(const Tensor& dst, const Tensor& src) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cudaStream_t stream = cuda::stream_for(dev);
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  if (contiguous && dst.dtype() == src.dtype()) {
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  cuda::visit_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    cuda::visit_device_dtype(src.dtype(), [&](auto s) {
      using S = decltype(s);
      D* out = static_cast<D*>(dst.data_ptr());
      const S* in = static_cast<const S*>(src.data_ptr());
      if (contiguous) {
        copy_contiguous_kernel<D, S>
            <<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
      } else {
        copy_strided_kernel<D, S><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
            out, geometry_of(dst), in, geometry_of(src), n);
      }
      ACCRUE_LAUNCH_CHECK();
    });
  });
}

void fill_cuda(const Tensor& dst, double value) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cuda::visit_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D v = cuda::convert<D>(value);
    fill_kernel<D><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::stream_for(dev)>>>(
        static_cast<D*>(dst.data_ptr()), geometry_of(dst), v, n);
    ACCRUE_LAUNCH_CHECK();
  });
}

void arange_cuda(const Tensor& dst, double start, double step) {
  const int dev = dst.device().index;
  cuda::DeviceScope scope(dev);
  const int64_t n = dst.numel();
  cuda::visit_device_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    arange_kernel<D><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::stream_for(dev)>>>(
        static_cast<D*>(dst.data_ptr()), start, step, n);
    ACCRUE_LAUNCH_CHECK();
  });
}

}  // namespace accrue::detail
