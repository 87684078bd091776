// The dispatch point of the transformer fusions (kernels/fused.h): validate,
// allocate, and call the backend of the inputs' device; on CUDA, linear and
// linear_gelu take the cuBLASLt epilogues where they run. Errors name the op
// and the offending shapes, dtypes or values.
#include "accrue/kernels/fused.h"

#include <cmath>
#include <utility>
#include <vector>

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/fused_backend.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

// `t` ([..., cols], rows * cols elements) as [rows, cols] with one row stride
// and stride 1 in cols, in place when its leading dims merge into one stride
// (a contiguous tensor, or the half of a packed [..., 2F] tensor), else a
// contiguous copy.
Tensor row_view(const Tensor& t, int64_t rows, int64_t cols) {
  if (t.dim() >= 1 && (cols <= 1 || t.stride(-1) == 1)) {
    int64_t row_stride = cols, next = -1;
    bool merges = true;
    for (int64_t i = t.dim() - 2; i >= 0 && merges; --i) {
      if (t.size(i) == 1) continue;
      if (next < 0) {
        row_stride = t.stride(i);
      } else {
        merges = t.stride(i) == next;
      }
      next = t.stride(i) * t.size(i);
    }
    if (merges) return make_view(t, {rows, cols}, {row_stride, 1}, t.offset());
  }
  return dense_view(t, {rows, cols});
}

// `t` ([..., cols], rows * cols elements) as [O, I, cols] with stride 1 in
// cols (rows = O * I), in place when its leading dims merge into at most two
// strided levels (any dense tensor; q or k of a packed [B, T, 3, H, D] qkv:
// O = B * T, I = H), else a contiguous copy.
Tensor row_levels_view(const Tensor& t, int64_t rows, int64_t cols) {
  if (cols <= 1 || t.stride(-1) == 1) {
    // From the innermost leading dim out: {size, stride} of each merged level.
    std::vector<std::pair<int64_t, int64_t>> levels;
    for (int64_t i = t.dim() - 2; i >= 0 && levels.size() <= 2; --i) {
      if (t.size(i) == 1) continue;
      if (!levels.empty() && t.stride(i) == levels.back().first * levels.back().second) {
        levels.back().first *= t.size(i);
      } else {
        levels.emplace_back(t.size(i), t.stride(i));
      }
    }
    if (levels.size() <= 2) {
      const int64_t inner = levels.empty() ? 1 : levels[0].first;
      const int64_t inner_stride = levels.empty() ? cols : levels[0].second;
      const int64_t outer = levels.size() == 2 ? levels[1].first : 1;
      const int64_t outer_stride = levels.size() == 2 ? levels[1].second : inner * inner_stride;
      return make_view(t, {outer, inner, cols}, {outer_stride, inner_stride, 1}, t.offset());
    }
  }
  const Tensor c = dense_view(t, {rows, cols});
  return make_view(c, {1, rows, cols}, {rows * cols, cols, 1}, c.offset());
}

// Checks of the normalized input and weight shared by rms_norm and add_rms_norm.
void check_rms_norm_args(const Tensor& x, const Tensor& weight, double eps, const char* name) {
  check_defined(x, name, "input");
  check_floating(x, name, "input");
  ACCRUE_CHECK(x.dim() >= 1 && x.size(-1) > 0, name,
               ": input must have a non-empty last dim to normalize, got shape ",
               shape_str(x.shape()));
  if (weight.defined()) {
    check_device(weight, x.device(), name, "weight", "the input");
    check_floating(weight, name, "weight");
    // x's dtype, or fp32 master weights next to 16-bit activations.
    check_dtype_or_f32(weight, x.dtype(), is_16_bit(x.dtype()), name, "weight");
    ACCRUE_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), name, ": weight of shape ",
                 shape_str(weight.shape()), " does not match the normalized dim of input ",
                 shape_str(x.shape()), " (expected [", x.size(-1), "])");
  }
  ACCRUE_CHECK(eps > 0.0 && std::isfinite(eps), name, ": eps must be finite and > 0, got ", eps);
}

Tensor contiguous_or_undefined(const Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

// x @ weight^T + bias as two kernels (the reference, and the fallback).
Tensor unfused_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return kernels::binary(BinaryOp::Add, kernels::matmul(x, weight.transpose(0, 1)), bias);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  NoGradGuard no_grad;
  const char* name = "linear";
  check_float_pair(x, weight, name, "input", "weight");
  check_float_pair(x, bias, name, "input", "bias");
  ACCRUE_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), name,
               ": input of shape ", shape_str(x.shape()), " does not match weight of shape ",
               shape_str(weight.shape()), " (expected [N, in] and [out, in])");
  const int64_t out_features = weight.size(0);
  ACCRUE_CHECK(bias.shape() == Shape{out_features}, name, ": bias of shape ",
               shape_str(bias.shape()), " does not match weight of shape ",
               shape_str(weight.shape()), " (expected [", out_features, "])");
  // The CPU, and CUDA where the epilogue cannot run, compose the two ops.
  if (!x.device().is_cuda()) return unfused_linear(x, weight, bias);
  Tensor out = empty({x.size(0), out_features}, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  // See Note [Bias epilogue] (kernels/cuda/gemm_epilogue.cu).
  const Tensor xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  if (cuda::gemm_bias(xc, wc, bc, out)) return out;
  return unfused_linear(xc, wc, bc);
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   Tensor* pre_activation) {
  NoGradGuard no_grad;
  const char* name = "linear_gelu";
  check_float_pair(x, weight, name, "input", "weight");
  check_float_pair(x, bias, name, "input", "bias");
  ACCRUE_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), name,
               ": input of shape ", shape_str(x.shape()), " does not match weight of shape ",
               shape_str(weight.shape()), " (expected [N, in] and [out, in])");
  const int64_t n = x.size(0), out_features = weight.size(0);
  ACCRUE_CHECK(bias.shape() == Shape{out_features}, name, ": bias of shape ",
               shape_str(bias.shape()), " does not match weight of shape ",
               shape_str(weight.shape()), " (expected [", out_features, "])");
  Tensor pre = empty({n, out_features}, x.dtype(), x.device());
  Tensor out = empty({n, out_features}, x.dtype(), x.device());
  if (pre_activation) *pre_activation = pre;
  if (out.numel() == 0) return out;
  const Tensor xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  // The CPU runs its reference; CUDA the cuBLASLt epilogue or its fallback.
  if (!x.device().is_cuda()) {
    cpu::linear_gelu(xc, wc, bc, pre, out);
    return out;
  }
  if (!cuda::gemm_bias_gelu(xc, wc, bc, pre, out)) {
    // Note [GELU epilogue] (kernels/cuda/gemm_epilogue.cu): a plain GEMM (into fp32
    // for 16-bit inputs, as the epilogue's accumulator), then bias and GELU.
    const Tensor acc =
        is_16_bit(x.dtype()) ? empty({n, out_features}, DType::f32, x.device()) : pre;
    gemm(xc, false, wc, true, acc, 1.0, 0.0);
    cuda::bias_gelu(acc, bc, pre, out);
  }
  return out;
}

Tensor gelu_backward(const Tensor& grad, const Tensor& pre_activation) {
  NoGradGuard no_grad;
  const char* name = "gelu_backward";
  check_float_pair(grad, pre_activation, name, "grad", "pre_activation");
  check_same_shape(grad, pre_activation, name, "grad", "pre_activation");
  Tensor out = empty(pre_activation.shape(), pre_activation.dtype(), pre_activation.device());
  if (out.numel() == 0) return out;
  // UnaryOp::Gelu's derivative reads the input only: pre_activation also
  // stands in for the forward output the backends' signature carries.
  ACCRUE_BACKEND_CALL(out.device(), unary_backward, UnaryOp::Gelu, grad, pre_activation,
                      pre_activation, 0.0, out);
  return out;
}

Tensor matmul_gelu_backward(const Tensor& grad, const Tensor& weight,
                            const Tensor& pre_activation) {
  NoGradGuard no_grad;
  const char* name = "matmul_gelu_backward";
  check_float_pair(grad, weight, name, "grad", "weight");
  check_float_pair(grad, pre_activation, name, "grad", "pre_activation");
  ACCRUE_CHECK(grad.dim() == 2 && weight.dim() == 2 && grad.size(1) == weight.size(0), name,
               ": grad of shape ", shape_str(grad.shape()), " does not match weight of shape ",
               shape_str(weight.shape()), " (expected [N, out] and [out, hidden])");
  const Shape pre_shape{grad.size(0), weight.size(1)};
  ACCRUE_CHECK(pre_activation.shape() == pre_shape, name, ": pre_activation of shape ",
               shape_str(pre_activation.shape()), " does not match grad of shape ",
               shape_str(grad.shape()), " and weight of shape ", shape_str(weight.shape()),
               " (expected ", shape_str(pre_shape), ")");
  // See Note [GELU gradient epilogue] (kernels/cuda/gemm_epilogue.cu): the
  // epilogue only where it measured faster than the two ops.
  constexpr int64_t kEpilogueMinRows = 32768;
  if (grad.device().is_cuda() && grad.size(0) >= kEpilogueMinRows) {
    Tensor dpre = empty(pre_shape, grad.dtype(), grad.device());
    if (dpre.numel() == 0) return dpre;
    const Tensor gc = grad.contiguous(), wc = weight.contiguous(), pc = pre_activation.contiguous();
    if (cuda::gemm_dgelu(gc, wc, pc, dpre)) return dpre;
  }
  // The CPU, and CUDA where the epilogue cannot run: the two ops.
  return gelu_backward(matmul(grad, weight), pre_activation);
}

ResidualLayerNormOutput residual_layer_norm(const Tensor& x, const Tensor& residual,
                                            const Tensor& weight, const Tensor& bias, double eps) {
  NoGradGuard no_grad;
  const char* name = "residual_layer_norm";
  check_float_pair(x, residual, name, "input", "residual");
  check_same_shape(x, residual, name, "input", "residual");
  ACCRUE_CHECK(x.dim() >= 1 && x.size(-1) > 0, name,
               ": input must have a non-empty last dim to normalize, got shape ",
               shape_str(x.shape()));
  const int64_t d = x.size(-1), rows = x.numel() / d;
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    check_device(*p, x.device(), name, what, "the input");
    // x's dtype, or fp32 master weights next to 16-bit activations.
    check_dtype_or_f32(*p, x.dtype(), is_16_bit(x.dtype()), name, what);
    ACCRUE_CHECK(p->dim() == 1 && p->size(0) == d, name, ": ", what, " of shape ",
                 shape_str(p->shape()), " does not match the normalized dim of input ",
                 shape_str(x.shape()), " (expected [", d, "])");
  }
  ACCRUE_CHECK(eps >= 0.0, name, ": eps must be >= 0, got ", eps);
  const Shape stats_shape(x.shape().begin(), x.shape().end() - 1);
  ResidualLayerNormOutput r{empty(x.shape(), x.dtype(), x.device()),
                            empty(x.shape(), x.dtype(), x.device()),
                            empty(stats_shape, widened(x.dtype()), x.device()),
                            empty(stats_shape, widened(x.dtype()), x.device())};
  if (rows == 0) return r;
  const Tensor w = weight.defined() ? dense_view(weight, {d}) : Tensor();
  const Tensor b = bias.defined() ? dense_view(bias, {d}) : Tensor();
  const Tensor x2 = dense_view(x, {rows, d}), r2 = dense_view(residual, {rows, d});
  const Tensor sum2 = dense_view(r.sum, {rows, d}), out2 = dense_view(r.out, {rows, d});
  const Tensor mean = dense_view(r.mean, {rows}), rstd = dense_view(r.rstd, {rows});
  ACCRUE_BACKEND_CALL(x.device(), residual_layer_norm, x2, r2, w, b, eps, sum2, out2, mean, rstd);
  return r;
}

// ---- RMSNorm ---------------------------------------------------------------------------

RmsNormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  NoGradGuard no_grad;
  const char* name = "rms_norm";
  check_rms_norm_args(x, weight, eps, name);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const Shape stats_shape(x.shape().begin(), x.shape().end() - 1);
  RmsNormOutput r{empty(x.shape(), x.dtype(), x.device()),
                  empty(stats_shape, widened(x.dtype()), x.device())};
  if (rows == 0) return r;
  ACCRUE_BACKEND_CALL(x.device(), rms_norm, row_levels_view(x, rows, d),
                      contiguous_or_undefined(weight), eps, dense_view(r.out, {rows, d}),
                      dense_view(r.rstd, {rows}));
  return r;
}

Tensor rms_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, bool want_dweight, NormPartials* partials,
                                  const Tensor& dx_add) {
  NoGradGuard no_grad;
  const char* name = "rms_norm_backward";
  ACCRUE_CHECK(partials != nullptr, name, ": no NormPartials to fill");
  check_rms_norm_args(x, weight, 1.0, name);
  check_like_input(grad, x, name, "grad");
  if (dx_add.defined()) check_like_input(dx_add, x, name, "dx_add");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const DType stats = widened(x.dtype());
  check_defined(rstd, name, "rstd");
  check_device(rstd, x.device(), name, "rstd", "the input");
  ACCRUE_CHECK(rstd.dtype() == stats && rstd.numel() == rows, name, ": rstd of shape ",
               shape_str(rstd.shape()), " and dtype ", dtype_name(rstd.dtype()),
               " does not match input ", shape_str(x.shape()), " (expected ", rows, " values of ",
               dtype_name(stats), ")");
  *partials = NormPartials{};
  partials->x_dtype = x.dtype();
  partials->d = d;
  Tensor dx = empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return dx;  // chunks 0: the totals are zeros
  ACCRUE_BACKEND_CALL(x.device(), rms_norm_backward_partials, dense_view(grad, {rows, d}),
                      row_levels_view(x, rows, d), contiguous_or_undefined(weight),
                      dense_view(rstd, {rows}), dense_view(dx, {rows, d}),
                      dx_add.defined() ? dense_view(dx_add, {rows, d}) : Tensor(), want_dweight,
                      partials);
  return dx;
}

Tensor rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const Tensor& rstd, const Tensor& dweight, bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "rms_norm_backward";
  check_rms_norm_args(x, weight, 1.0, name);
  if (dweight.defined()) {
    const int64_t d = x.size(-1);
    check_device(dweight, x.device(), name, "dweight", "the input");
    check_dtype_or_f32(dweight, x.dtype(), true, name, "dweight");
    ACCRUE_CHECK(dweight.dim() == 1 && dweight.size(0) == d, name, ": dweight of shape ",
                 shape_str(dweight.shape()), " does not match the normalized dim of input ",
                 shape_str(x.shape()), " (expected [", d, "])");
    check_contiguous(dweight, name, "dweight");
  }
  NormPartials partials;
  Tensor dx = rms_norm_backward_partials(grad, x, weight, rstd, dweight.defined(), &partials);
  norm_param_totals(partials, dweight, Tensor(), accumulate);
  return dx;
}

ResidualRmsNormOutput add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                   double eps) {
  NoGradGuard no_grad;
  const char* name = "add_rms_norm";
  check_float_pair(x, residual, name, "input", "residual");
  check_same_shape(x, residual, name, "input", "residual");
  check_rms_norm_args(x, weight, eps, name);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const Shape stats_shape(x.shape().begin(), x.shape().end() - 1);
  ResidualRmsNormOutput r{empty(x.shape(), x.dtype(), x.device()),
                          empty(x.shape(), x.dtype(), x.device()),
                          empty(stats_shape, widened(x.dtype()), x.device())};
  if (rows == 0) return r;
  ACCRUE_BACKEND_CALL(x.device(), add_rms_norm, dense_view(x, {rows, d}),
                      dense_view(residual, {rows, d}), contiguous_or_undefined(weight), eps,
                      dense_view(r.sum, {rows, d}), dense_view(r.out, {rows, d}),
                      dense_view(r.rstd, {rows}));
  return r;
}

// ---- rotary embedding -----------------------------------------------------------------------

namespace {

// Every check of rope and rope_; returns the positions as [B, T] (a [T] one
// broadcast with stride 0), or an undefined tensor when x is empty.
Tensor checked_rope_positions(const Tensor& x, const Tensor& positions, double theta,
                              const RopeScaling& scaling, bool check_positions, const char* name) {
  check_defined(x, name, "input");
  check_floating(x, name, "input");
  ACCRUE_CHECK(x.dim() == 4, name, ": input of shape ", shape_str(x.shape()),
               " must be 4-D [B, T, H, D] (batch, token, head, head dim)");
  const int64_t b = x.size(0), t = x.size(1), d = x.size(3);
  ACCRUE_CHECK(d > 0 && d % 2 == 0, name, ": head dim D = ", d, " of input ", shape_str(x.shape()),
               " must be even and > 0 (pairs are rotated)");
  check_defined(positions, name, "positions");
  check_device(positions, x.device(), name, "positions", "the input");
  check_dtype(positions, DType::i64, name, "positions");
  ACCRUE_CHECK((positions.dim() == 2 && positions.size(0) == b && positions.size(1) == t) ||
                   (positions.dim() == 1 && positions.size(0) == t),
               name, ": positions of shape ", shape_str(positions.shape()), " do not match input ",
               shape_str(x.shape()), " (expected [", b, ", ", t, "] or [", t, "])");
  ACCRUE_CHECK(theta > 0.0 && std::isfinite(theta), name, ": theta must be finite and > 0, got ",
               theta);
  if (scaling.type == RopeScaling::Type::llama3) {
    ACCRUE_CHECK(
        scaling.factor > 0.0 && scaling.low_freq_factor > 0.0 &&
            scaling.high_freq_factor > scaling.low_freq_factor && scaling.original_max_position > 0,
        name, ": llama3 scaling needs factor > 0, 0 < low_freq_factor < ",
        "high_freq_factor and original_max_position > 0; got factor ", scaling.factor,
        ", low_freq_factor ", scaling.low_freq_factor, ", high_freq_factor ",
        scaling.high_freq_factor, ", original_max_position ", scaling.original_max_position);
  }
  if (x.numel() == 0) return Tensor();
  // Note [Deferred index checks]: eager outside a window, on the device inside one.
  if (check_positions) check_index_range(positions, kRopeMaxPosition, 0, false, name, "positions");
  return positions.dim() == 2
             ? positions
             : make_view(positions, {b, t}, {0, positions.stride(0)}, positions.offset());
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
            const RopeScaling& scaling, bool inverse, bool check_positions) {
  NoGradGuard no_grad;
  const Tensor pv = checked_rope_positions(x, positions, theta, scaling, check_positions, "rope");
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (!pv.defined()) return out;
  const Tensor xv = x.stride(3) == 1 ? x : x.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), rope, xv, pv, theta, style, scaling, inverse, out);
  return out;
}

void rope_(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
           const RopeScaling& scaling, bool inverse) {
  NoGradGuard no_grad;
  const char* name = "rope_";
  const Tensor pv = checked_rope_positions(x, positions, theta, scaling, true, name);
  if (!pv.defined()) return;
  check_unit_last_stride(x, name, "input");
  for (int64_t i = 0; i < 3; ++i)
    ACCRUE_CHECK(x.size(i) == 1 || x.stride(i) != 0, name, ": input of shape ",
                 shape_str(x.shape()), " and strides ", shape_str(x.strides()),
                 " overlaps itself (a 0 stride); rotate a copy with rope instead");
  ACCRUE_BACKEND_CALL(x.device(), rope, x, pv, theta, style, scaling, inverse, x);
}

// ---- SwiGLU ----------------------------------------------------------------------------------

namespace {

void check_swiglu_pair(const Tensor& gate, const Tensor& up, const char* name) {
  check_float_pair(gate, up, name, "gate", "up");
  check_same_shape(gate, up, name, "gate", "up");
  ACCRUE_CHECK(gate.dim() >= 1, name, ": gate and up must have at least one dim, got shape ",
               shape_str(gate.shape()));
}

void check_packed(const Tensor& x, const char* name) {
  check_defined(x, name, "input");
  check_floating(x, name, "input");
  ACCRUE_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, name, ": input of shape ", shape_str(x.shape()),
               " must end in an even dim 2F (gate, then up)");
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  NoGradGuard no_grad;
  const char* name = "swiglu";
  check_swiglu_pair(gate, up, name);
  Tensor out = empty(gate.shape(), gate.dtype(), gate.device());
  if (out.numel() == 0) return out;
  const int64_t f = gate.size(-1), rows = gate.numel() / f;
  ACCRUE_BACKEND_CALL(gate.device(), swiglu, row_view(gate, rows, f), row_view(up, rows, f),
                      dense_view(out, {rows, f}));
  return out;
}

Tensor swiglu_packed(const Tensor& x) {
  NoGradGuard no_grad;
  const char* name = "swiglu_packed";
  check_packed(x, name);
  const int64_t f = x.size(-1) / 2;
  Shape shape = x.shape();
  shape.back() = f;
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const int64_t rows = out.numel() / f;
  ACCRUE_BACKEND_CALL(x.device(), swiglu, row_view(x.narrow(-1, 0, f), rows, f),
                      row_view(x.narrow(-1, f, f), rows, f), dense_view(out, {rows, f}));
  return out;
}

SwigluGrads swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up) {
  NoGradGuard no_grad;
  const char* name = "swiglu_backward";
  check_swiglu_pair(gate, up, name);
  check_float_pair(grad, gate, name, "grad", "gate");
  check_same_shape(grad, gate, name, "grad", "gate");
  SwigluGrads r{empty(gate.shape(), gate.dtype(), gate.device()),
                empty(gate.shape(), gate.dtype(), gate.device())};
  if (gate.numel() == 0) return r;
  const int64_t f = gate.size(-1), rows = gate.numel() / f;
  ACCRUE_BACKEND_CALL(gate.device(), swiglu_backward, row_view(grad, rows, f),
                      row_view(gate, rows, f), row_view(up, rows, f),
                      dense_view(r.dgate, {rows, f}), dense_view(r.dup, {rows, f}));
  return r;
}

Tensor swiglu_packed_backward(const Tensor& grad, const Tensor& x) {
  NoGradGuard no_grad;
  const char* name = "swiglu_packed_backward";
  check_packed(x, name);
  const int64_t f = x.size(-1) / 2;
  Shape shape = x.shape();
  shape.back() = f;
  check_float_pair(grad, x, name, "grad", "input");
  ACCRUE_CHECK(grad.shape() == shape, name, ": grad of shape ", shape_str(grad.shape()),
               " does not match input ", shape_str(x.shape()), " (expected ", shape_str(shape),
               ")");
  Tensor dx = empty(x.shape(), x.dtype(), x.device());
  if (dx.numel() == 0) return dx;
  const int64_t rows = grad.numel() / f;
  // dgate and dup are the two halves of the one [rows, 2F] gradient.
  const Tensor dx2 = dx.view({rows, 2 * f});
  ACCRUE_BACKEND_CALL(x.device(), swiglu_backward, row_view(grad, rows, f),
                      row_view(x.narrow(-1, 0, f), rows, f), row_view(x.narrow(-1, f, f), rows, f),
                      dx2.narrow(1, 0, f), dx2.narrow(1, f, f));
  return dx;
}

}  // namespace accrue::kernels
