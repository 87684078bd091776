// Note [Pointwise convolution as a GEMM] (kernels/conv_backend.h): 1 x 1
// convolutions over channels-last activations as cuBLASLt GEMMs on views.
#include <utility>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::pointwise {

namespace {

// [N, C, H, W] laid out N, H, W, C: channels-last, or contiguous where that
// is the same memory order (C == 1, or H == W == 1).
bool rows_layout(const Tensor& t) {
  return dispatch_util::channels_last(t) ||
         (t.is_contiguous() && (t.size(1) == 1 || t.size(2) * t.size(3) == 1));
}

// t [N, C, H, W] as the matrix [N H W, C]: a view when t is laid out N, H, W,
// C, else a copy.
Tensor rows(const Tensor& t) {
  const Tensor nhwc = t.permute({0, 2, 3, 1});
  const int64_t m = t.size(0) * t.size(2) * t.size(3);
  return (rows_layout(t) ? nhwc : nhwc.contiguous()).reshape({m, t.size(1)});
}

// A fresh channels-last [n, c, h, w] and its rows [n h w, c].
std::pair<Tensor, Tensor> channels_last_with_rows(int64_t n, int64_t c, int64_t h, int64_t w,
                                                  DType dtype, Device device) {
  const Tensor nhwc = empty({n, h, w, c}, dtype, device);
  return {nhwc.permute({0, 3, 1, 2}), nhwc.reshape({n * h * w, c})};
}

}  // namespace

bool applies(const Tensor& x, const Conv2dGeometry& g) {
  const Conv2dOptions& o = g.options;
  return g.kh == 1 && g.kw == 1 && o.stride_h == 1 && o.stride_w == 1 && o.pad_h == 0 &&
         o.pad_w == 0 && o.dilation_h == 1 && o.dilation_w == 1 && o.groups == 1 && x.dim() == 4 &&
         rows_layout(x);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  auto [out, out_rows] = channels_last_with_rows(g.n, g.o, g.oh, g.ow, x.dtype(), x.device());
  gemm(rows(x), false, weight.contiguous().reshape({g.o, g.c}), true, out_rows, 1.0, 0.0);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  auto [dx, dx_rows] = channels_last_with_rows(g.n, g.c, g.h, g.w, grad.dtype(), grad.device());
  gemm(rows(grad), false, weight.contiguous().reshape({g.o, g.c}), false, dx_rows, 1.0, 0.0);
  return dx;
}

void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta) {
  NoGradGuard no_grad;
  // Note [Fused weight-gradient accumulation]: beta 0 never reads the slot.
  gemm(rows(grad), true, rows(x), false, grad_weight.reshape({g.o, g.c}), 1.0, beta);
}

}  // namespace accrue::kernels::pointwise
