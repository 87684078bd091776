// The composed convolution of Note [Composed convolution] (kernels/conv_backend.h):
// conv2d, its data gradient and its weight gradient from ops every backend
// already has (strided copies, GEMMs, strided adds), for devices without a
// convolution of their own.
#include <algorithm>
#include <vector>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels::composed {

namespace {

// x zero-padded to [n, c, h + 2 pad_h, w + 2 pad_w] (x itself, contiguous, without padding).
Tensor padded(const Tensor& x, const Conv2dGeometry& g) {
  const Conv2dOptions& o = g.options;
  if (o.pad_h == 0 && o.pad_w == 0) return x.contiguous();
  Tensor xp = zeros({g.n, g.c, g.h + 2 * o.pad_h, g.w + 2 * o.pad_w}, x.dtype(), x.device());
  xp.narrow(2, o.pad_h, g.h).narrow(3, o.pad_w, g.w).copy_(x);
  return xp;
}

// The view of a contiguous padded input xp [n, c, hp, wp] whose element
// (n, oh, ow, c, i, j) is the input under kernel tap (i, j) of output (oh, ow).
Tensor window_view(const Tensor& xp, const Conv2dGeometry& g) {
  const Conv2dOptions& o = g.options;
  const int64_t wp = xp.size(3), plane = xp.size(2) * wp;
  return make_view(
      xp, {g.n, g.oh, g.ow, g.c, g.kh, g.kw},
      {g.c * plane, o.stride_h * wp, o.stride_w, plane, o.dilation_h * wp, o.dilation_w},
      xp.offset());
}

// im2col: [n * oh * ow, c * kh * kw], the columns of group k contiguous in k's block.
Tensor columns(const Tensor& x, const Conv2dGeometry& g) {
  return window_view(padded(x, g), g).contiguous().reshape({g.n * g.oh * g.ow, g.c * g.kh * g.kw});
}

// Group k's [rows, block] slice of a [rows, groups * block] matrix, contiguous.
Tensor group_block(const Tensor& m, int64_t k, int64_t block, int64_t groups) {
  return groups == 1 ? m : m.narrow(1, k * block, block).contiguous();
}

// The output gradient as [n * oh * ow, o], the layout of the GEMMs.
Tensor grad_rows(const Tensor& grad, const Conv2dGeometry& g) {
  return grad.permute({0, 2, 3, 1}).contiguous().reshape({g.n * g.oh * g.ow, g.o});
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  const int64_t groups = g.options.groups, og = g.o / groups, kg = g.c / groups * g.kh * g.kw;
  const Tensor cols = columns(x, g);
  const Tensor w = weight.contiguous().reshape({g.o, kg});
  Tensor rows = empty({g.n * g.oh * g.ow, g.o}, x.dtype(), x.device());
  for (int64_t k = 0; k < groups; ++k) {
    const Tensor wk = w.narrow(0, k * og, og);  // whole rows: contiguous
    if (groups == 1) {
      gemm(cols, false, wk, true, rows, 1.0, 0.0);
    } else {
      Tensor yk = empty({rows.size(0), og}, x.dtype(), x.device());
      gemm(group_block(cols, k, kg, groups), false, wk, true, yk, 1.0, 0.0);
      rows.narrow(1, k * og, og).copy_(yk);
    }
  }
  return rows.reshape({g.n, g.oh, g.ow, g.o}).permute({0, 3, 1, 2}).contiguous();
}

Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  const Conv2dOptions& o = g.options;
  const int64_t groups = o.groups, og = g.o / groups, cg = g.c / groups, kg = cg * g.kh * g.kw;
  const Tensor dy = grad_rows(grad, g);
  const Tensor w = weight.contiguous().reshape({g.o, kg});
  // dcols [n * oh * ow, c * kh * kw] = dy @ W, per group.
  Tensor dcols = empty({dy.size(0), g.c * g.kh * g.kw}, widened(grad.dtype()), grad.device());
  for (int64_t k = 0; k < groups; ++k) {
    const Tensor dyk = group_block(dy, k, og, groups);
    const Tensor wk = w.narrow(0, k * og, og);
    if (groups == 1) {
      gemm(dyk, false, wk, false, dcols, 1.0, 0.0);
    } else {
      Tensor dk = empty({dy.size(0), kg}, dcols.dtype(), grad.device());
      gemm(dyk, false, wk, false, dk, 1.0, 0.0);
      dcols.narrow(1, k * kg, kg).copy_(dk);
    }
  }
  // col2im: each kernel tap adds its columns into the positions it read.
  // Within one tap the positions are distinct; the taps overlap, so they run
  // one after another, accumulating in f32 (f64 for f64).
  Tensor dxp =
      zeros({g.n, g.c, g.h + 2 * o.pad_h, g.w + 2 * o.pad_w}, dcols.dtype(), grad.device());
  const Tensor taps = dcols.reshape({g.n, g.oh, g.ow, g.c, g.kh, g.kw});
  const Tensor windows = window_view(dxp, g);
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j)
      axpy_(windows.select(4, i).select(4, j), 1.0, taps.select(4, i).select(4, j));
  return dxp.narrow(2, o.pad_h, g.h).narrow(3, o.pad_w, g.w).contiguous().to(grad.dtype());
}

void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight,
                            const Conv2dGeometry& g, double beta) {
  NoGradGuard no_grad;
  const int64_t groups = g.options.groups, og = g.o / groups, kg = g.c / groups * g.kh * g.kw;
  const Tensor dy = grad_rows(grad, g);
  const Tensor cols = columns(x, g);
  // dW [o, kg] (= or +=) dy^T @ cols, per group, straight into grad_weight's
  // rows (Note [Fused weight-gradient accumulation]; beta 0 never reads them).
  const Tensor dw = grad_weight.reshape({g.o, kg});
  for (int64_t k = 0; k < groups; ++k)
    gemm(group_block(dy, k, og, groups), true, group_block(cols, k, kg, groups), false,
         dw.narrow(0, k * og, og), 1.0, beta);
}

namespace {

// Output cell (i, j)'s rows [h0, h1) and columns [w0, w1), as kernels/conv.h says.
struct Cell {
  int64_t h0, h1, w0, w1;
  double inv_area() const { return 1.0 / static_cast<double>((h1 - h0) * (w1 - w0)); }
};
Cell adaptive_cell(const Conv2dGeometry& g, int64_t i, int64_t j) {
  return {i * g.h / g.oh, ((i + 1) * g.h + g.oh - 1) / g.oh, j * g.w / g.ow,
          ((j + 1) * g.w + g.ow - 1) / g.ow};
}

// fn(i, j, cell) for every output cell, row by row.
template <class Fn>
void for_each_cell(const Conv2dGeometry& g, Fn fn) {
  for (int64_t i = 0; i < g.oh; ++i)
    for (int64_t j = 0; j < g.ow; ++j)
      fn(i, j, adaptive_cell(g, i, j));
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  const Tensor xw = x.to(widened(x.dtype()));
  Tensor out = empty({g.n, g.c, g.oh, g.ow}, xw.dtype(), x.device());
  for_each_cell(g, [&](int64_t i, int64_t j, const Cell& c) {
    const Tensor s =
        kernels::sum(xw.narrow(2, c.h0, c.h1 - c.h0).narrow(3, c.w0, c.w1 - c.w0), {2, 3});
    out.select(3, j).select(2, i).copy_(binary_scalar(BinaryOp::Mul, s, c.inv_area()));
  });
  return out.to(x.dtype());
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad, const Conv2dGeometry& g) {
  NoGradGuard no_grad;
  const Tensor gw = grad.to(widened(grad.dtype()));
  Tensor dx = zeros({g.n, g.c, g.h, g.w}, gw.dtype(), grad.device());
  // Cells overlap where the sizes do not divide: their adds run one after another.
  for_each_cell(g, [&](int64_t i, int64_t j, const Cell& c) {
    axpy_(dx.narrow(2, c.h0, c.h1 - c.h0).narrow(3, c.w0, c.w1 - c.w0), c.inv_area(),
          gw.narrow(2, i, 1).narrow(3, j, 1));
  });
  return dx.to(grad.dtype());
}

namespace {

// The divisor of each output cell [oh, ow] in `dtype`: the window's size, or
// with count_include_pad false the input elements it covers.
Tensor pool_divisors(const Conv2dGeometry& g, bool count_include_pad, DType dtype, Device device) {
  const Conv2dOptions& o = g.options;
  std::vector<double> d(static_cast<size_t>(g.oh * g.ow));
  for (int64_t i = 0; i < g.oh; ++i)
    for (int64_t j = 0; j < g.ow; ++j) {
      const int64_t h0 = i * o.stride_h - o.pad_h, w0 = j * o.stride_w - o.pad_w;
      const int64_t rows = std::min(h0 + g.kh, g.h) - std::max<int64_t>(h0, 0);
      const int64_t cols = std::min(w0 + g.kw, g.w) - std::max<int64_t>(w0, 0);
      d[static_cast<size_t>(i * g.ow + j)] =
          static_cast<double>(count_include_pad ? g.kh * g.kw : rows * cols);
    }
  return from_vector<double>(d, {g.oh, g.ow}, dtype, device);
}

}  // namespace

Tensor avg_pool2d(const Tensor& x, const Conv2dGeometry& g, bool count_include_pad) {
  NoGradGuard no_grad;
  const Tensor xw = x.to(widened(x.dtype()));
  const Tensor windows = window_view(padded(xw, g), g)  // [n, oh, ow, c, kh, kw]
                             .permute({0, 3, 1, 2, 4, 5})
                             .contiguous()
                             .reshape({g.n, g.c, g.oh, g.ow, g.kh * g.kw});
  const Tensor sums = kernels::sum(windows, {4});
  return kernels::binary(BinaryOp::Div, sums,
                         pool_divisors(g, count_include_pad, xw.dtype(), x.device()))
      .to(x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad, const Conv2dGeometry& g, bool count_include_pad) {
  NoGradGuard no_grad;
  const Conv2dOptions& o = g.options;
  const DType acc = widened(grad.dtype());
  // Each window's share, [n, oh, ow, c] as the window view orders them.
  const Tensor share = kernels::binary(BinaryOp::Div, grad.to(acc),
                                       pool_divisors(g, count_include_pad, acc, grad.device()))
                           .permute({0, 2, 3, 1});
  Tensor dxp = zeros({g.n, g.c, g.h + 2 * o.pad_h, g.w + 2 * o.pad_w}, acc, grad.device());
  const Tensor windows = window_view(dxp, g);
  for (int64_t i = 0; i < g.kh; ++i)  // taps overlap: one strided add after another
    for (int64_t j = 0; j < g.kw; ++j)
      axpy_(windows.select(4, i).select(4, j), 1.0, share);
  return dxp.narrow(2, o.pad_h, g.h).narrow(3, o.pad_w, g.w).contiguous().to(grad.dtype());
}

}  // namespace accrue::kernels::composed
