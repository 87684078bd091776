#include "accrue/core/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "accrue/core/copy_geometry.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/parallel.h"

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

namespace {

// Elements per chunk of a threaded copy or fill (Note [CPU threads]).
constexpr int64_t kCopyGrain = int64_t{1} << 15;

// The element offsets [lo, hi] that t's view spans, in bytes from its data pointer.
std::pair<intptr_t, intptr_t> byte_span(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = t.strides()[d] * (t.shape()[d] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<intptr_t>(t.data_ptr());
  const auto size = static_cast<intptr_t>(element_size(t.dtype()));
  return {base + lo * size, base + (hi + 1) * size};
}

// Whether two elements of dst share an address, or dst and src overlap:
// then the one-thread order decides the result, and the copy stays on one
// thread.
bool order_matters(const Tensor& dst, const Tensor* src) {
  for (int64_t d = 0; d < dst.dim(); ++d)
    if (dst.strides()[d] == 0 && dst.shape()[d] > 1) return true;
  if (src == nullptr) return false;
  const auto a = byte_span(dst), b = byte_span(*src);
  return a.first < b.second && b.first < a.second;
}

// Calls fn(row, dst offset, src offset) for rows of the last dim (src may be
// dst for a fill), threads splitting the rows (Note [CPU threads]): every
// element is written once, by the same code as with one thread.
template <class F>
void for_each_row(const Tensor& dst, const Tensor* src, F&& fn) {
  if (dst.numel() == 0) return;
  const StridedGeometry gd = geometry_of(dst), gs = geometry_of(src ? *src : dst);
  const int64_t inner = dst.dim() == 0 ? 1 : dst.shape().back();
  const int64_t rows = dst.numel() / inner;
  const int64_t grain = order_matters(dst, src) ? rows : std::max<int64_t>(1, kCopyGrain / inner);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      fn(gd.offset_of(r * inner), gs.offset_of(r * inner));
  });
}

}  // namespace

void copy_cpu(const Tensor& dst, const Tensor& src) {
  const int64_t inner = dst.dim() == 0 ? 1 : dst.shape().back();
  const int64_t sd = dst.dim() == 0 ? 0 : dst.strides().back();
  const int64_t ss = src.dim() == 0 ? 0 : src.strides().back();
  visit_any_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D* out = static_cast<D*>(dst.data_ptr());
    visit_any_dtype(src.dtype(), [&](auto s) {
      using S = decltype(s);
      const S* in = static_cast<const S*>(src.data_ptr());
      for_each_row(dst, &src, [&](int64_t od, int64_t os) {
        for (int64_t c = 0; c < inner; ++c) {
          if constexpr (std::is_same_v<D, S>) {
            out[od + c * sd] = in[os + c * ss];
          } else {
            out[od + c * sd] = from_double<D>(to_double<S>(in[os + c * ss]));
          }
        }
      });
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  const int64_t inner = dst.dim() == 0 ? 1 : dst.shape().back();
  const int64_t sd = dst.dim() == 0 ? 0 : dst.strides().back();
  visit_any_dtype(dst.dtype(), [&](auto d) {
    using D = decltype(d);
    D* out = static_cast<D*>(dst.data_ptr());
    const D v = from_double<D>(value);
    for_each_row(dst, nullptr, [&](int64_t od, int64_t) {
      for (int64_t c = 0; c < inner; ++c)
        out[od + c * sd] = v;
    });
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
