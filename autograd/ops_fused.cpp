// Differentiable transformer fusions: linear + bias + GELU in one GEMM, the
// residual add fused with the LayerNorm or RMSNorm that follows it, RMSNorm,
// rotary embeddings and SwiGLU (kernels/fused.h).
#include <string>

#include "accrue/autograd/node.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/autograd/weight_grad_branch.h"
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
                  Tensor dw, db;
                  autograd::linear_param_grads(dpre, sx, sw, gw ? &w_target : nullptr,
                                               gb ? &b_target : nullptr, &dw, &db);
                  Tensor dx;
                  if (gx) dx = kernels::matmul(dpre, sw).reshape(x_shape);
                  return {dx, dw, db};
                });
}

Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias) {
  const char* name = "linear_gelu_linear";
  ACCRUE_CHECK(fc_weight.defined() && fc_weight.dim() == 2 && proj_weight.defined() &&
                   proj_weight.dim() == 2,
               name, ": weights must be 2-D, got fc_weight ",
               fc_weight.defined() ? shape_str(fc_weight.shape()) : "undefined",
               " and proj_weight ",
               proj_weight.defined() ? shape_str(proj_weight.shape()) : "undefined");
  ACCRUE_CHECK(proj_weight.size(1) == fc_weight.size(0), name, ": proj_weight of shape ",
               shape_str(proj_weight.shape()), " does not take fc_weight's ", fc_weight.size(0),
               " outputs (fc_weight of shape ", shape_str(fc_weight.shape()), ")");
  ACCRUE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == fc_weight.size(1), name,
               ": input of shape ", x.defined() ? shape_str(x.shape()) : "undefined",
               " does not match fc_weight of shape ", shape_str(fc_weight.shape()));
  ACCRUE_CHECK(fc_bias.defined() && fc_bias.shape() == Shape{fc_weight.size(0)} &&
                   proj_bias.defined() && proj_bias.shape() == Shape{proj_weight.size(0)},
               name, ": biases of shapes ",
               fc_bias.defined() ? shape_str(fc_bias.shape()) : "undefined", " and ",
               proj_bias.defined() ? shape_str(proj_bias.shape()) : "undefined",
               " for weights of shapes ", shape_str(fc_weight.shape()), " and ",
               shape_str(proj_weight.shape()));
  const int64_t in = fc_weight.size(1), out_features = proj_weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const Tensor x2 = detach(x).reshape({-1, in});
  Tensor pre;
  const Tensor h = kernels::linear_gelu(x2, detach(fc_weight), detach(fc_bias), &pre);
  Tensor out = kernels::linear(h, detach(proj_weight), detach(proj_bias)).reshape(out_shape);
  Tensor sx = saved(x2), sh = saved(h), sw1 = saved(fc_weight), sw2 = saved(proj_weight),
         spre = pre;
  const bool gx = wants_grad(x), gw1 = wants_grad(fc_weight), gb1 = wants_grad(fc_bias),
             gw2 = wants_grad(proj_weight), gb2 = wants_grad(proj_bias);
  const Shape x_shape = x.shape();
  const SinkTarget w1_target = sink_target(fc_weight), b1_target = sink_target(fc_bias),
                   w2_target = sink_target(proj_weight), b2_target = sink_target(proj_bias);
  return record("LinearGeluLinearBackward", out, {x, fc_weight, fc_bias, proj_weight, proj_bias},
                [=](const Tensor& g) -> std::vector<Tensor> {
                  // The projection's parameter gradients, then the GELU's gradient in
                  // one GEMM (Note [GELU gradient epilogue]), then fc's: linear's
                  // backward twice, with gelu_backward folded into the first dx.
                  const Tensor g2 = g.reshape({-1, out_features});
                  Tensor dw1, db1, dw2, db2, dx;
                  autograd::linear_param_grads(g2, sh, sw2, gw2 ? &w2_target : nullptr,
                                               gb2 ? &b2_target : nullptr, &dw2, &db2);
                  if (!(gx || gw1 || gb1)) return {dx, dw1, db1, dw2, db2};
                  const Tensor dpre = kernels::matmul_gelu_backward(g2, sw2, spre);
                  autograd::linear_param_grads(dpre, sx, sw1, gw1 ? &w1_target : nullptr,
                                               gb1 ? &b1_target : nullptr, &dw1, &db1);
                  if (gx) dx = kernels::matmul(dpre, sw1).reshape(x_shape);
                  return {dx, dw1, db1, dw2, db2};
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
  Tensor normed = autograd::record_gathering(
      "LayerNormBackward", r.out, {sum, weight, bias}, 0,
      autograd::layer_norm_backward_fn(sum, weight, bias, r.mean, r.rstd));
  return {sum, normed};
}

namespace {

// The backward of the RMSNorm node over saved input x: dx, and the weight's
// gradient straight into its arena slot when it has one (Note [Fused
// weight-gradient accumulation]), else into a fresh tensor the engine lands.
autograd::GatheringBackwardFn rms_norm_backward_fn(const Tensor& x, const Tensor& weight,
                                                   const Tensor& rstd) {
  Tensor sx = saved(x), sw = saved(weight);
  const bool gw = wants_grad(weight);
  const Shape d_shape{x.size(-1)};
  const DType w_dtype = weight.defined() ? weight.dtype() : x.dtype();
  const SinkTarget w_target = sink_target(weight);
  return [=](const Tensor& g, const Tensor& gathered) -> std::vector<Tensor> {
    // Note [Fan-out sums in the backward]
    const autograd::GatheredForInput from_others(gathered, sx);
    double beta = 0.0;
    kernels::NormPartials partials;
    if (gw && w_target.peek(&beta)) {
      // dx, then dweight's totals into its slot: on the weight-gradient branch
      // when one is in force (Note [Weight gradients on a branch]).
      Tensor dx =
          kernels::rms_norm_backward_partials(g, sx, sw, rstd, true, &partials, from_others.dx_add);
      autograd::write_slots_beside(true, {partials.dweight}, [&] {
        const Tensor slot = w_target.claim(&beta);
        kernels::norm_param_totals(partials, slot, Tensor(), /*accumulate=*/beta != 0.0);
      });
      return {from_others.added_to(dx), autograd::delivered()};
    }
    const Tensor dw = gw ? empty(d_shape, w_dtype, g.device()) : Tensor();
    Tensor dx =
        kernels::rms_norm_backward_partials(g, sx, sw, rstd, gw, &partials, from_others.dx_add);
    kernels::norm_param_totals(partials, dw, Tensor(), /*accumulate=*/false);
    return {from_others.added_to(dx), dw};
  };
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  kernels::RmsNormOutput r = kernels::rms_norm(x, weight, eps);
  return autograd::record_gathering("RmsNormBackward", r.out, {x, weight}, 0,
                                    rms_norm_backward_fn(x, weight, r.rstd));
}

ResidualNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          double eps) {
  kernels::ResidualRmsNormOutput r = kernels::add_rms_norm(x, residual, weight, eps);
  // Two nodes, as residual_layer_norm: the sum as an add, the normalized
  // output as the RMSNorm node of that recorded sum.
  Tensor sum =
      record("AddBackward", r.sum, {x, residual}, [](const Tensor& g) -> std::vector<Tensor> {
        return {g, g};
      });
  Tensor normed = autograd::record_gathering("RmsNormBackward", r.out, {sum, weight}, 0,
                                             rms_norm_backward_fn(sum, weight, r.rstd));
  return {sum, normed};
}

Tensor rope(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
            const RopeScaling& scaling) {
  Tensor out = kernels::rope(x, positions, theta, style, scaling);
  // The rotation is orthogonal: its transpose is the rotation by -angle.
  Tensor sp = detach(positions);
  return record("RopeBackward", out, {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::rope(g, sp, theta, style, scaling, /*inverse=*/true,
                          /*check_positions=*/false)};
  });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = kernels::swiglu(gate, up);
  Tensor sg = saved(gate), su = saved(up);
  return record("SwigluBackward", out, {gate, up}, [=](const Tensor& g) -> std::vector<Tensor> {
    kernels::SwigluGrads d = kernels::swiglu_backward(g, sg, su);
    return {d.dgate, d.dup};
  });
}

Tensor swiglu_packed(const Tensor& x) {
  Tensor out = kernels::swiglu_packed(x);
  Tensor sx = saved(x);
  return record("SwigluBackward", out, {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::swiglu_packed_backward(g, sx)};
  });
}

}  // namespace accrue
