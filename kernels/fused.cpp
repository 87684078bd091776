// The dispatch point of the transformer fusions (kernels/fused.h): validate,
// allocate, and call the backend of the inputs' device; on CUDA, linear and
// linear_gelu take the cuBLASLt epilogues where they run. Errors name the op
// and the offending shapes, dtypes or values.
#include "accrue/kernels/fused.h"

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/fused_backend.h"
#include "accrue/kernels/ops.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

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

}  // namespace accrue::kernels
