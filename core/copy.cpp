#include "accrue/core/copy.h"

#include <cstring>

#include "accrue/core/copy_geometry.h"
#include "accrue/core/cuda_runtime.h"

#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "accrue/core/status_check.h"
#endif

namespace accrue::detail {

void copy_same_device(const Tensor& dst, const Tensor& src) {
  ACCRUE_CHECK(dst.shape() == src.shape(), "copy: shapes ", shape_str(dst.shape()), " and ",
               shape_str(src.shape()), " differ");
  ACCRUE_CHECK(dst.device() == src.device(), "copy: devices ", dst.device().str(), " and ",
               src.device().str(), " differ");
  if (dst.numel() == 0) return;
  if (dst.device().is_cpu()) return copy_cpu(dst, src);
  copy_cuda(dst, src);
}

void fill_same_device(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  if (dst.device().is_cpu()) return fill_cpu(dst, value);
  fill_cuda(dst, value);
}

void arange_same_device(const Tensor& dst, double start, double step) {
  if (dst.numel() == 0) return;
  if (dst.device().is_cpu()) return arange_cpu(dst, start, step);
  arange_cuda(dst, start, step);
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  const StridedGeometry gd = geometry_of(dst), gs = geometry_of(src);
  const int64_t n = dst.numel();
  visit_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D* out = static_cast<D*>(dst.data_ptr());
    visit_dtype(src.dtype(), [&](auto s) {
      using S = decltype(s);
      const S* in = static_cast<const S*>(src.data_ptr());
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<D, S>) {
          out[gd.offset_of(i)] = in[gs.offset_of(i)];
        } else {
          out[gd.offset_of(i)] = from_double<D>(to_double<S>(in[gs.offset_of(i)]));
        }
      }
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  const StridedGeometry g = geometry_of(dst);
  visit_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D* out = static_cast<D*>(dst.data_ptr());
    const D v = from_double<D>(value);
    for (int64_t i = 0, n = dst.numel(); i < n; ++i)
      out[g.offset_of(i)] = v;
  });
}

void arange_cpu(const Tensor& dst, double start, double step) {
  visit_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D* out = static_cast<D*>(dst.data_ptr());
    for (int64_t i = 0, n = dst.numel(); i < n; ++i)
      out[i] = from_double<D>(start + static_cast<double>(i) * step);
  });
}

#ifdef ACCRUE_WITH_CUDA
void memcpy_between(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  const int dev = src_device.is_cuda() ? src_device.index : dst_device.index;
  set_cuda_device(dev);
  StreamHandle stream = current_stream(dev);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    ACCRUE_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
  } else {
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  }
  // A host destination (or a pageable host source) must be complete before the caller reads or
  // frees it.
  if (dst_device.is_cpu() || src_device.is_cpu()) ACCRUE_CUDA_CHECK(cudaStreamSynchronize(stream));
}
#else
namespace {
[[noreturn]] void no_cuda(const char* op) {
  ACCRUE_FAIL(op, " on a CUDA tensor: accrue was built without CUDA");
}
}  // namespace

void memcpy_between(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes) {
  if (dst_device.is_cuda() || src_device.is_cuda()) no_cuda("memcpy");
  if (nbytes) std::memcpy(dst, src, nbytes);
}
void copy_cuda(const Tensor&, const Tensor&) {
  no_cuda("copy");
}
void fill_cuda(const Tensor&, double) {
  no_cuda("fill");
}
void arange_cuda(const Tensor&, double, double) {
  no_cuda("arange");
}
#endif

}  // namespace accrue::detail
