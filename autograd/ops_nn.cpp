// Differentiable matrix products and neural-network ops.
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/autograd/sink_target.h"
#include "accrue/autograd/weight_grad_branch.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using autograd::sink_target;
using autograd::SinkTarget;
using autograd::wants_grad;

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::matmul(a, b);
  Tensor sa = saved(a), sb = saved(b);
  const bool ga = wants_grad(a), gb = wants_grad(b);
  return record("MatmulBackward", out, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    // Work in the promoted (>= 2-D) shapes: a 1-D a is [1, K], a 1-D b is [K, 1].
    const Tensor a2 = sa.dim() == 1 ? sa.unsqueeze(0) : sa;
    const Tensor b2 = sb.dim() == 1 ? sb.unsqueeze(-1) : sb;
    Shape g_shape = g.shape();
    if (sa.dim() == 1) g_shape.insert(g_shape.end() - (sb.dim() == 1 ? 0 : 1), 1);
    if (sb.dim() == 1) g_shape.push_back(1);
    const Tensor g2 = g.reshape(g_shape);
    Tensor da, db;
    if (ga) {
      da = kernels::sum_to(kernels::matmul(g2, b2.transpose(-1, -2)), a2.shape())
               .reshape(sa.shape());
    }
    if (gb) {
      db = kernels::sum_to(kernels::matmul(a2.transpose(-1, -2), g2), b2.shape())
               .reshape(sb.shape());
    }
    return {da, db};
  });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ACCRUE_CHECK(weight.defined() && weight.dim() == 2, "linear: weight must be 2-D [out, in]");
  ACCRUE_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1),
               "linear: input of shape ", shape_str(x.shape()), " does not match weight of shape ",
               shape_str(weight.shape()));
  ACCRUE_CHECK(!bias.defined() || bias.shape() == Shape{weight.size(0)}, "linear: bias of shape ",
               bias.defined() ? shape_str(bias.shape()) : "", " for weight of shape ",
               shape_str(weight.shape()));
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor x2 = detach(x).reshape({-1, in});
  // With a bias, one GEMM with the bias in its epilogue on CUDA (Note [Bias
  // epilogue] in kernels/cuda/gemm_epilogue.cu); matmul then add on the CPU.
  const Tensor y2 = bias.defined() ? kernels::linear(x2, detach(weight), detach(bias))
                                   : kernels::matmul(x2, detach(weight).transpose(0, 1));
  Tensor out = y2.reshape(out_shape);
  Tensor sx = saved(x2), sw = saved(weight);
  const bool gx = wants_grad(x), gw = wants_grad(weight), gb = wants_grad(bias);
  const Shape x_shape = x.shape();
  const SinkTarget w_target = sink_target(weight), b_target = sink_target(bias);
  return record("LinearBackward", out, {x, weight, bias},
                [=](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor g2 = g.reshape({-1, out_features});
                  Tensor dw, db;
                  autograd::linear_param_grads(g2, sx, sw, gw ? &w_target : nullptr,
                                               gb ? &b_target : nullptr, &dw, &db);
                  Tensor dx;
                  if (gx) dx = kernels::matmul(g2, sw).reshape(x_shape);
                  return {dx, dw, db};
                });
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = kernels::embedding(weight, indices);
  Tensor si = saved(indices);
  const Shape w_shape = weight.shape();
  const DType w_dtype = weight.dtype();
  const SinkTarget target = sink_target(weight);
  return record("EmbeddingBackward", out, {weight}, [=](const Tensor& g) -> std::vector<Tensor> {
    double beta = 0.0;
    Tensor slot = target.claim(&beta);
    Tensor dw = slot.defined() ? slot : empty(w_shape, w_dtype, g.device());
    kernels::embedding_backward(g, si, dw, /*accumulate=*/beta != 0.0);
    return {slot.defined() ? autograd::delivered() : dw};
  });
}

Loss cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  kernels::LossSum r = kernels::cross_entropy(logits, targets, ignore_index);
  Tensor sl = saved(logits), st = saved(targets);
  const DType dtype = logits.dtype();
  Tensor sum =
      record("CrossEntropyBackward", r.sum, {logits}, [=](const Tensor& g) -> std::vector<Tensor> {
        return {kernels::cross_entropy_backward(sl, st, ignore_index, g).to(dtype)};
      });
  return {sum, r.count};
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  kernels::LayerNormOutput r = kernels::layer_norm(x, weight, bias, eps);
  return autograd::record_gathering(
      "LayerNormBackward", r.out, {x, weight, bias}, 0,
      autograd::layer_norm_backward_fn(x, weight, bias, r.mean, r.rstd));
}

namespace autograd {

Tensor linear_weight_grad(const Tensor& g2, const Tensor& x2, const Tensor& weight_like,
                          const SinkTarget& target) {
  // Note [Fused weight-gradient accumulation]: dW = g^T x is one GEMM whose
  // output is the arena's fp32 slot, beta 0 on the window's first
  // contribution and 1 after.
  double beta = 0.0;
  Tensor slot = target.claim(&beta);
  Tensor dw =
      slot.defined() ? slot : empty(weight_like.shape(), weight_like.dtype(), weight_like.device());
  kernels::gemm(g2, /*transpose_a=*/true, x2, false, dw, 1.0, beta);
  return slot.defined() ? delivered() : dw;
}

Tensor linear_bias_grad(const Tensor& g2, const SinkTarget& target) {
  double beta = 0.0;
  Tensor slot = target.claim(&beta);
  Tensor db = slot.defined() ? slot : empty({g2.size(1)}, g2.dtype(), g2.device());
  kernels::sum_rows_into(g2, db, /*accumulate=*/beta != 0.0);
  return slot.defined() ? delivered() : db;
}

void linear_param_grads(const Tensor& g2, const Tensor& x2, const Tensor& weight_like,
                        const SinkTarget* w_target, const SinkTarget* b_target, Tensor* dw,
                        Tensor* db) {
  if (w_target == nullptr && b_target == nullptr) return;  // no parameter wants a gradient
  // Note [Weight gradients on a branch]: beside the data gradient when both go into slots.
  double beta = 0.0;
  const bool in_slots = (w_target == nullptr || w_target->peek(&beta)) &&
                        (b_target == nullptr || b_target->peek(&beta));
  write_slots_beside(in_slots, {g2, x2}, [&] {
    if (w_target) *dw = linear_weight_grad(g2, x2, weight_like, *w_target);
    if (b_target) *db = linear_bias_grad(g2, *b_target);
  });
}

GatheredForInput::GatheredForInput(const Tensor& gathered, const Tensor& x) {
  const bool fits = gathered.defined() && gathered.dtype() == x.dtype() &&
                    gathered.shape() == x.shape() && gathered.device() == x.device();
  if (fits)
    dx_add = gathered;
  else
    after = gathered;
}

Tensor GatheredForInput::added_to(const Tensor& dx) const {
  return after.defined() ? kernels::binary(kernels::BinaryOp::Add, after, dx) : dx;
}

GatheringBackwardFn layer_norm_backward_fn(const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, const Tensor& mean,
                                           const Tensor& rstd) {
  Tensor sx = saved(x), sw = saved(weight);
  const bool gw = wants_grad(weight), gb = wants_grad(bias);
  const Shape d_shape{x.size(-1)};
  const DType w_dtype = weight.defined() ? weight.dtype() : x.dtype();
  const DType b_dtype = bias.defined() ? bias.dtype() : x.dtype();
  const SinkTarget w_target = sink_target(weight), b_target = sink_target(bias);
  return [=](const Tensor& g, const Tensor& gathered) -> std::vector<Tensor> {
    const GatheredForInput from_others(gathered, sx);  // Note [Fan-out sums in the backward]
    // Both affine gradients go straight into their arena slots when both have
    // one with the same beta (the usual case); otherwise into fresh tensors
    // that the engine lands.
    double beta_w = 0.0, beta_b = 0.0;
    const bool direct =
        gw && gb && w_target.peek(&beta_w) && b_target.peek(&beta_b) && beta_w == beta_b;
    if (direct) {
      // dx, then the parameters' totals into their slots: on the weight-gradient
      // branch when one is in force (Note [Weight gradients on a branch]).
      kernels::NormPartials partials;
      Tensor dx = kernels::layer_norm_backward_partials(g, sx, sw, mean, rstd, true, true,
                                                        &partials, from_others.dx_add);
      write_slots_beside(true, {partials.dweight, partials.dbias}, [&] {
        const Tensor dw = w_target.claim(&beta_w), db = b_target.claim(&beta_b);
        kernels::norm_param_totals(partials, dw, db, /*accumulate=*/beta_w != 0.0);
      });
      return {from_others.added_to(dx), delivered(), delivered()};
    }
    const Tensor dw = gw ? empty(d_shape, w_dtype, g.device()) : Tensor();
    const Tensor db = gb ? empty(d_shape, b_dtype, g.device()) : Tensor();
    kernels::NormPartials partials;
    Tensor dx = kernels::layer_norm_backward_partials(g, sx, sw, mean, rstd, gw, gb, &partials,
                                                      from_others.dx_add);
    kernels::norm_param_totals(partials, dw, db, /*accumulate=*/false);
    return {from_others.added_to(dx), dw, db};
  };
}

}  // namespace autograd

}  // namespace accrue
