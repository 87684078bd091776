// The CPU reference of kernels/conv.h: plain loops over contiguous f64 NCHW
// tensors, in a fixed order (Note [Determinism]).
#include <cmath>
#include <limits>

#include "accrue/kernels/conv_backend.h"

namespace accrue::kernels::cpu {

namespace {

// The input row (or column) that output position `out` reads at kernel tap
// `tap`: out * stride - pad + tap * dilation (may fall in the padding).
int64_t input_at(int64_t out, int64_t tap, int64_t stride, int64_t pad, int64_t dilation) {
  return out * stride - pad + tap * dilation;
}

// Visits every (n, output channel, oh, ow, input channel of its group, kh,
// kw) whose input position lies inside the image, with the flat offsets of
// the input, weight and output elements.
template <class F>
void for_each_tap(const Conv2dGeometry& g, F&& f) {
  const Conv2dOptions& o = g.options;
  const int64_t cg = g.c / o.groups, og = g.o / o.groups;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oc = 0; oc < g.o; ++oc) {
      const int64_t first_c = (oc / og) * cg;
      for (int64_t y = 0; y < g.oh; ++y)
        for (int64_t x = 0; x < g.ow; ++x) {
          const int64_t out_at = ((n * g.o + oc) * g.oh + y) * g.ow + x;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < g.kh; ++i) {
              const int64_t ih = input_at(y, i, o.stride_h, o.pad_h, o.dilation_h);
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iw = input_at(x, j, o.stride_w, o.pad_w, o.dilation_w);
                if (iw < 0 || iw >= g.w) continue;
                const int64_t in_at = ((n * g.c + first_c + c) * g.h + ih) * g.w + iw;
                const int64_t w_at = ((oc * cg + c) * g.kh + i) * g.kw + j;
                f(in_at, w_at, out_at);
              }
            }
        }
    }
}

// Visits every pooling window: plane p (n * c + channel), output (y, x), and
// each in-image input position (ih, iw) with its flat offset in the plane.
template <class Begin, class Tap, class End>
void for_each_window(const Conv2dGeometry& g, Begin&& begin, Tap&& tap, End&& end) {
  const Conv2dOptions& o = g.options;
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t x = 0; x < g.ow; ++x) {
        const int64_t out_at = (p * g.oh + y) * g.ow + x;
        begin(out_at);
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t ih = input_at(y, i, o.stride_h, o.pad_h, 1);
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iw = input_at(x, j, o.stride_w, o.pad_w, 1);
            if (iw < 0 || iw >= g.w) continue;
            tap(p * g.h * g.w, ih * g.w + iw);
          }
        }
        end(out_at);
      }
}

// The number of elements avg_pool2d divides window (y, x) by.
int64_t window_divisor(const Conv2dGeometry& g, int64_t y, int64_t x, bool count_include_pad) {
  const Conv2dOptions& o = g.options;
  const int64_t h0 = y * o.stride_h - o.pad_h, w0 = x * o.stride_w - o.pad_w;
  if (count_include_pad) {
    // PyTorch counts the padding but not what lies past it.
    const int64_t h1 = std::min(h0 + g.kh, g.h + o.pad_h), w1 = std::min(w0 + g.kw, g.w + o.pad_w);
    return (h1 - h0) * (w1 - w0);
  }
  const int64_t h1 = std::min(h0 + g.kh, g.h), w1 = std::min(w0 + g.kw, g.w);
  return (h1 - std::max<int64_t>(h0, 0)) * (w1 - std::max<int64_t>(w0, 0));
}

int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return (i * in) / out;
}
int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

}  // namespace

void conv2d(const Tensor& x, const Tensor& weight, const Tensor& out, const Conv2dGeometry& g) {
  const double* xs = x.data<double>();
  const double* ws = weight.data<double>();
  double* os = out.data<double>();
  out.fill_(0.0);
  for_each_tap(
      g, [&](int64_t in_at, int64_t w_at, int64_t out_at) { os[out_at] += xs[in_at] * ws[w_at]; });
}

void conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Tensor& dx,
                           const Conv2dGeometry& g) {
  const double* gs = grad.data<double>();
  const double* ws = weight.data<double>();
  double* ds = dx.data<double>();
  dx.fill_(0.0);
  for_each_tap(
      g, [&](int64_t in_at, int64_t w_at, int64_t out_at) { ds[in_at] += gs[out_at] * ws[w_at]; });
}

void conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& dw,
                            const Conv2dGeometry& g) {
  const double* gs = grad.data<double>();
  const double* xs = x.data<double>();
  double* ds = dw.data<double>();
  dw.fill_(0.0);
  for_each_tap(
      g, [&](int64_t in_at, int64_t w_at, int64_t out_at) { ds[w_at] += gs[out_at] * xs[in_at]; });
}

void max_pool2d(const Tensor& x, const Tensor& out, const Tensor& indices,
                const Conv2dGeometry& g) {
  const double* xs = x.data<double>();
  double* os = out.data<double>();
  int64_t* is = indices.data<int64_t>();
  double best = 0.0;
  int64_t best_at = -1;
  for_each_window(
      g,
      [&](int64_t) {
        best = -std::numeric_limits<double>::infinity();
        best_at = -1;
      },
      [&](int64_t plane, int64_t at) {
        const double v = xs[plane + at];
        // The first maximum; a NaN wins and stays (as PyTorch propagates it).
        if (best_at < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) {
          best = v;
          best_at = at;
        }
      },
      [&](int64_t out_at) {
        os[out_at] = best;
        is[out_at] = best_at;
      });
}

void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx,
                         const Conv2dGeometry& g) {
  const double* gs = grad.data<double>();
  const int64_t* is = indices.data<int64_t>();
  double* ds = dx.data<double>();
  dx.fill_(0.0);
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t k = 0; k < g.oh * g.ow; ++k) {
      const int64_t at = p * g.oh * g.ow + k;
      ds[p * g.h * g.w + is[at]] += gs[at];
    }
}

void avg_pool2d(const Tensor& x, const Tensor& out, const Conv2dGeometry& g,
                bool count_include_pad) {
  const double* xs = x.data<double>();
  double* os = out.data<double>();
  double sum = 0.0;
  for_each_window(
      g, [&](int64_t) { sum = 0.0; }, [&](int64_t plane, int64_t at) { sum += xs[plane + at]; },
      [&](int64_t out_at) {
        const int64_t yx = out_at % (g.oh * g.ow);
        os[out_at] =
            sum / static_cast<double>(window_divisor(g, yx / g.ow, yx % g.ow, count_include_pad));
      });
}

void avg_pool2d_backward(const Tensor& grad, const Tensor& dx, const Conv2dGeometry& g,
                         bool count_include_pad) {
  const double* gs = grad.data<double>();
  double* ds = dx.data<double>();
  dx.fill_(0.0);
  double share = 0.0;
  for_each_window(
      g,
      [&](int64_t out_at) {
        const int64_t yx = out_at % (g.oh * g.ow);
        share = gs[out_at] /
                static_cast<double>(window_divisor(g, yx / g.ow, yx % g.ow, count_include_pad));
      },
      [&](int64_t plane, int64_t at) { ds[plane + at] += share; }, [](int64_t) {});
}

void adaptive_avg_pool2d(const Tensor& x, const Tensor& out, const Conv2dGeometry& g) {
  const double* xs = x.data<double>();
  double* os = out.data<double>();
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t x = 0; x < g.ow; ++x) {
        const int64_t h0 = adaptive_start(y, g.h, g.oh), h1 = adaptive_end(y, g.h, g.oh);
        const int64_t w0 = adaptive_start(x, g.w, g.ow), w1 = adaptive_end(x, g.w, g.ow);
        double sum = 0.0;
        for (int64_t i = h0; i < h1; ++i)
          for (int64_t j = w0; j < w1; ++j)
            sum += xs[(p * g.h + i) * g.w + j];
        os[(p * g.oh + y) * g.ow + x] = sum / static_cast<double>((h1 - h0) * (w1 - w0));
      }
}

void adaptive_avg_pool2d_backward(const Tensor& grad, const Tensor& dx, const Conv2dGeometry& g) {
  const double* gs = grad.data<double>();
  double* ds = dx.data<double>();
  dx.fill_(0.0);
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t x = 0; x < g.ow; ++x) {
        const int64_t h0 = adaptive_start(y, g.h, g.oh), h1 = adaptive_end(y, g.h, g.oh);
        const int64_t w0 = adaptive_start(x, g.w, g.ow), w1 = adaptive_end(x, g.w, g.ow);
        const double share =
            gs[(p * g.oh + y) * g.ow + x] / static_cast<double>((h1 - h0) * (w1 - w0));
        for (int64_t i = h0; i < h1; ++i)
          for (int64_t j = w0; j < w1; ++j)
            ds[(p * g.h + i) * g.w + j] += share;
      }
}

}  // namespace accrue::kernels::cpu
