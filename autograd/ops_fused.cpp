// Differentiable transformer fusions: linear + bias + GELU in one GEMM, and
// the residual add fused with the LayerNorm that follows it (kernels/fused.h).
#include <string>

#include "accrue/autograd/node.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using autograd::sink_target;
using autograd::SinkTarget;
using autograd::wants_grad;

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "linear_gelu: weight must be 2-D [out, in]",
               weight.defined() ? ", got shape " + shape_str(weight.shape()) : std::string());
  ACCRUE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1),
               "linear_gelu: input of shape ", x.defined() ? shape_str(x.shape()) : "undefined",
               " does not match weight of shape ", shape_str(weight.shape()));
  ACCRUE_CHECK(bias.defined() && bias.shape() == Shape{weight.size(0)},
               "linear_gelu: bias of shape ",
               bias.defined() ? shape_str(bias.shape()) : "undefined", " for weight of shape ",
               shape_str(weight.shape()), " (expected [", weight.size(0), "])");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const Tensor x2 = detach(x).reshape({-1, in});
  Tensor pre;
  Tensor y2 = kernels::linear_gelu(x2, detach(weight), detach(bias), &pre);
  Tensor out = y2.reshape(out_shape);
  Tensor sx = saved(x2), sw = saved(weight), spre = pre;
  const bool gx = wants_grad(x), gw = wants_grad(weight), gb = wants_grad(bias);
  const Shape x_shape = x.shape();
  const SinkTarget w_target = sink_target(weight), b_target = sink_target(bias);
  return record("LinearGeluBackward", out, {x, weight, bias},
                [=](const Tensor& g) -> std::vector<Tensor> {
                  // dpre = g * gelu'(pre); from there it is linear's backward,
                  // the parameter gradients straight into their slots (Note
                  // [Fused weight-gradient accumulation]).
                  const Tensor dpre = kernels::gelu_backward(g.reshape({-1, out_features}), spre);
                  Tensor dx, dw, db;
                  if (gx) dx = kernels::matmul(dpre, sw).reshape(x_shape);
                  if (gw) dw = autograd::linear_weight_grad(dpre, sx, sw, w_target);
                  if (gb) db = autograd::linear_bias_grad(dpre, b_target);
                  return {dx, dw, db};
                });
}

ResidualNorm residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                 const Tensor& bias, double eps) {
  kernels::ResidualLayerNormOutput r = kernels::residual_layer_norm(x, residual, weight, bias, eps);
  // Two nodes, so that each result has its own gradient path: the sum as an
  // add (same shapes: its gradient passes to both inputs as is) and the
  // normalized output as the LayerNorm node of that recorded sum.
  Tensor sum =
      record("AddBackward", r.sum, {x, residual}, [](const Tensor& g) -> std::vector<Tensor> {
        return {g, g};
      });
  Tensor normed = record("LayerNormBackward", r.out, {sum, weight, bias},
                         autograd::layer_norm_backward_fn(sum, weight, bias, r.mean, r.rstd));
  return {sum, normed};
}

}  // namespace accrue
