// Differentiable conv2d and pooling: backward next to forward (autograd/conv_ops.h).
#include "autograd/conv_ops.h"

#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/saved.h"
#include "autograd/sink_target.h"
#include "autograd/variable.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using autograd::sink_target;
using autograd::SinkTarget;

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  Tensor out = kernels::conv2d(x, detach(weight), options);
  Tensor sx = saved(x), sw = saved(weight);
  const bool gx = autograd::wants_grad(x), gw = autograd::wants_grad(weight);
  const Shape x_shape = x.shape();
  const SinkTarget w_target = sink_target(weight);
  out = record("Conv2dBackward", out, {x, weight}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor dx, dw;
    if (gx) dx = kernels::conv2d_backward_input(g, sw, x_shape, options);
    if (gw) {
      // Note [Fused weight-gradient accumulation]: into the slot, beta 0 then 1.
      double beta = 0.0;
      Tensor slot = w_target.claim(&beta);
      Tensor target = slot.defined() ? slot : empty(sw.shape(), sw.dtype(), sw.device());
      kernels::conv2d_backward_weight(g, sx, target, options, beta);
      dw = slot.defined() ? autograd::delivered() : target;
    }
    return {dx, dw};
  });
  if (!bias.defined()) return out;
  ACCRUE_CHECK(bias.dim() == 1 && bias.size(0) == out.size(1), "conv2d: bias has shape ",
               shape_str(bias.shape()), "; expected [", out.size(1), "] (one per output channel)");
  return add(out, reshape(bias, {1, bias.size(0), 1, 1}));
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  kernels::MaxPoolOutput r = kernels::max_pool2d(x, options);
  const Tensor indices = r.indices;
  const Shape x_shape = x.shape();
  return record("MaxPool2dBackward", r.out, {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::max_pool2d_backward(g, indices, x_shape)};
  });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Shape x_shape = x.shape();
  return record("AvgPool2dBackward", kernels::avg_pool2d(x, options), {x},
                [=](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::avg_pool2d_backward(g, x_shape, options)};
                });
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const Shape x_shape = x.shape();
  return record("AdaptiveAvgPool2dBackward", kernels::adaptive_avg_pool2d(x, out_h, out_w), {x},
                [=](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::adaptive_avg_pool2d_backward(g, x_shape)};
                });
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  ACCRUE_CHECK(x.defined() && x.dim() >= 2, "group_norm: input has shape ",
               x.defined() ? shape_str(x.shape()) : "(undefined)",
               "; expected [N, C, ...] with at least 2 dims");
  const int64_t n = x.size(0), c = x.size(1);
  ACCRUE_CHECK(groups >= 1 && c % groups == 0, "group_norm: ", groups, " groups do not divide the ",
               c, " channels of input ", shape_str(x.shape()));
  ACCRUE_CHECK(eps > 0.0, "group_norm: eps = ", eps, " must be > 0");
  for (const Tensor* p : {&weight, &bias})
    ACCRUE_CHECK(!p->defined() || p->shape() == Shape{c},
                 "group_norm: ", p == &weight ? "weight" : "bias", " has shape ",
                 shape_str(p->shape()), "; expected [", c, "] (one per channel of input ",
                 shape_str(x.shape()), ")");
  const bool narrow_float = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
  const Tensor xs = narrow_float ? to_dtype(x, DType::f32) : x;
  const Tensor grouped = reshape(xs, {n, groups, -1});
  const Tensor centered = grouped - mean(grouped, {2}, /*keepdim=*/true);
  const Tensor var = mean(centered * centered, {2}, /*keepdim=*/true);
  Tensor y = reshape(centered / sqrt(var + eps), x.shape());
  if (narrow_float) y = to_dtype(y, x.dtype());
  Shape per_channel(static_cast<size_t>(x.dim()), 1);
  per_channel[1] = c;
  if (weight.defined()) y = y * reshape(weight, per_channel);
  if (bias.defined()) y = y + reshape(bias, per_channel);
  return y;
}

}  // namespace accrue
