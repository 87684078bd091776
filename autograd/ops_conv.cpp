// Differentiable conv2d and pooling: backward next to forward (autograd/conv_ops.h).
#include "accrue/autograd/conv_ops.h"

#include <vector>

#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/variable.h"
#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/kernels/batch_norm.h"
#include "accrue/kernels/ops.h"

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
    if (gw) {
      // Note [Weight gradients on a branch]: beside the data gradient when it
      // goes into a slot, so issued first.
      double beta = 0.0;
      autograd::write_slots_beside(w_target.peek(&beta), {g, sx}, [&] {
        // Note [Fused weight-gradient accumulation]: into the slot, beta 0 then 1.
        Tensor slot = w_target.claim(&beta);
        Tensor target = slot.defined() ? slot : empty(sw.shape(), sw.dtype(), sw.device());
        kernels::conv2d_backward_weight(g, sx, target, options, beta);
        dw = slot.defined() ? autograd::delivered() : target;
      });
    }
    if (gx) dx = kernels::conv2d_backward_input(g, sw, x_shape, options);
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
    return {kernels::max_pool2d_backward(g, indices, x_shape, options)};
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

// Note [Fused batch norm]
// ~~~~~~~~~~~~~~~~~~~~~~~
// BatchNorm's training forward as one node instead of the dozen the composed
// formula records, on the fused kernels of kernels/batch_norm.h (Note [Fused
// batch norm kernels]: statistics in f32, f64 for f64, Note [BatchNorm in
// f32]; the output in x's layout). The node saves only x and the per-channel
// mean and invstd, where the composed formula kept the f32 centered values
// and more, and the backward recomputes what it needs from them.
// dweight and dbias go straight into their arena slots when they have them,
// unrounded (Note [Fused weight-gradient accumulation]: beta 0 copies, beta 1
// adds); without a slot they are returned in the parameter's dtype.
BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ACCRUE_CHECK(x.defined() && x.dim() >= 2, "batch_norm: input has shape ",
               x.defined() ? shape_str(x.shape()) : "(undefined)",
               "; expected [N, C, ...] with at least 2 dims");
  const int64_t c = x.size(1);
  for (const Tensor* p : {&weight, &bias}) {
    const char* what = p == &weight ? "weight" : "bias";
    ACCRUE_CHECK(p->defined() && p->shape() == Shape{c}, "batch_norm: ", what, " has shape ",
                 p->defined() ? shape_str(p->shape()) : "(undefined)", "; expected [", c,
                 "] (one per channel of input ", shape_str(x.shape()), ")");
    ACCRUE_CHECK(p->dtype() == x.dtype() && p->device() == x.device(), "batch_norm: ", what, " is ",
                 dtype_name(p->dtype()), " on ", p->device().str(), ", the input ",
                 dtype_name(x.dtype()), " on ", x.device().str());
  }
  const kernels::BatchNormForward f =
      kernels::batch_norm_forward(detach(x), detach(weight), detach(bias), eps);

  const Tensor sx = saved(x), sw = saved(weight), mean = f.mean, invstd = f.invstd;
  const bool gx = autograd::wants_grad(x), gw = autograd::wants_grad(weight),
             gb = autograd::wants_grad(bias);
  const SinkTarget w_target = sink_target(weight), b_target = sink_target(bias);
  const DType w_dtype = weight.dtype(), b_dtype = bias.dtype();
  // The parameter gradient `value` (acc [C]) into its slot, or returned in `dtype`.
  auto land = [](const SinkTarget& target, const Tensor& value, DType dtype) -> Tensor {
    double beta = 0.0;
    Tensor slot = target.claim(&beta);
    if (!slot.defined()) return value.to(dtype);
    if (beta == 0.0) {
      slot.copy_(value);  // Note [Overwrite first]: the slot is not read
    } else {
      kernels::axpy_(slot, 1.0, value);  // converted to the slot's dtype: Note [Mixed axpy]
    }
    return autograd::delivered();
  };
  BatchNormResult r;
  r.out = record("BatchNormBackward", f.out, {x, weight, bias},
                 [=](const Tensor& g) -> std::vector<Tensor> {
                   const kernels::BatchNormBackward b =
                       kernels::batch_norm_backward(g, sx, sw, mean, invstd, gx);
                   Tensor dw, db;
                   if (gw) dw = land(w_target, b.dweight, w_dtype);
                   if (gb) db = land(b_target, b.dbias, b_dtype);
                   return {b.dx, dw, db};
                 });
  r.mean = f.mean;
  r.var = f.var;
  return r;
}

}  // namespace accrue
