// The dispatch point of the transformer fusions (kernels/fused.h): validate,
// allocate, and call the CPU reference or the CUDA path by the inputs'
// device. Errors name the op and the offending shapes, dtypes or values.
#include "kernels/fused.h"
#include "core/grad_mode.h"
#include "kernels/backend.h"
#include "kernels/fused_backend.h"
#include "kernels/ops.h"

namespace accrue::kernels {

namespace {

void check_defined(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// a and b: defined, on one device, of one floating dtype.
void check_float_pair(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                      const char* what_b) {
  check_defined(a, op, what_a);
  check_defined(b, op, what_b);
  ACCRUE_CHECK(a.device() == b.device(), op, ": ", what_a, " is on ", a.device().str(), " and ",
               what_b, " on ", b.device().str(), " (shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), ")");
  ACCRUE_CHECK(a.dtype() == b.dtype(), op, ": ", what_a, " has dtype ", dtype_name(a.dtype()),
               " and ", what_b, " ", dtype_name(b.dtype()), " (shapes ", shape_str(a.shape()),
               " and ", shape_str(b.shape()), ")");
  ACCRUE_CHECK(is_floating(a.dtype()), op, ": ", what_a, " of shape ", shape_str(a.shape()),
               " has dtype ", dtype_name(a.dtype()),
               "; expected a floating dtype (f32, f64, bf16 or f16)");
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                      const char* what_b) {
  ACCRUE_CHECK(a.shape() == b.shape(), op, ": ", what_a, " of shape ", shape_str(a.shape()),
               " and ", what_b, " of shape ", shape_str(b.shape()), " differ");
}

bool is_16_bit(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

// t made contiguous and viewed as [rows, cols] (t has rows * cols elements).
Tensor as_rows(const Tensor& t, int64_t rows, int64_t cols) {
  const Tensor c = t.contiguous();
  return make_view(c, {rows, cols}, {cols, 1}, c.offset());
}

Tensor as_vector(const Tensor& t, int64_t n) {
  const Tensor c = t.contiguous();
  return make_view(c, {n}, {1}, c.offset());
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
  if (x.device().is_cpu()) return unfused_linear(x, weight, bias);
#ifdef ACCRUE_WITH_CUDA
  Tensor out = empty({x.size(0), out_features}, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  // See Note [Bias epilogue] (kernels/cuda/matmul.cu).
  const Tensor xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  if (cuda::gemm_bias(xc, wc, bc, out)) return out;
  return unfused_linear(xc, wc, bc);
#else
  ACCRUE_FAIL(name, ": a CUDA tensor, but accrue was built without CUDA");
#endif
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
  if (x.device().is_cpu()) {
    cpu::linear_gelu(xc, wc, bc, pre, out);
    return out;
  }
#ifdef ACCRUE_WITH_CUDA
  if (!cuda::gemm_bias_gelu(xc, wc, bc, pre, out)) {
    // Note [GELU epilogue] (kernels/cuda/matmul.cu): a plain GEMM (into fp32
    // for 16-bit inputs, as the epilogue's accumulator), then bias and GELU.
    const Tensor acc =
        is_16_bit(x.dtype()) ? empty({n, out_features}, DType::f32, x.device()) : pre;
    gemm(xc, false, wc, true, acc, 1.0, 0.0);
    cuda::bias_gelu(acc, bc, pre, out);
  }
  return out;
#else
  ACCRUE_FAIL(name, ": a CUDA tensor, but accrue was built without CUDA");
#endif
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
  if (out.device().is_cpu()) {
    cpu::unary_backward(UnaryOp::Gelu, grad, pre_activation, pre_activation, 0.0, out);
  } else {
    cuda::unary_backward(UnaryOp::Gelu, grad, pre_activation, pre_activation, 0.0, out);
  }
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
    ACCRUE_CHECK(p->device() == x.device(), name, ": ", what, " is on ", p->device().str(),
                 " and input on ", x.device().str());
    // x's dtype, or fp32 master weights next to 16-bit activations.
    ACCRUE_CHECK(p->dtype() == x.dtype() || (is_16_bit(x.dtype()) && p->dtype() == DType::f32),
                 name, ": ", what, " of shape ", shape_str(p->shape()), " has dtype ",
                 dtype_name(p->dtype()), "; expected ", dtype_name(x.dtype()),
                 is_16_bit(x.dtype()) ? " or f32" : "");
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
  const Tensor w = weight.defined() ? as_vector(weight, d) : Tensor();
  const Tensor b = bias.defined() ? as_vector(bias, d) : Tensor();
  const Tensor x2 = as_rows(x, rows, d), r2 = as_rows(residual, rows, d);
  const Tensor sum2 = as_rows(r.sum, rows, d), out2 = as_rows(r.out, rows, d);
  const Tensor mean = as_vector(r.mean, rows), rstd = as_vector(r.rstd, rows);
  if (x.device().is_cpu()) {
    cpu::residual_layer_norm(x2, r2, w, b, eps, sum2, out2, mean, rstd);
  } else {
#ifdef ACCRUE_WITH_CUDA
    cuda::residual_layer_norm(x2, r2, w, b, eps, sum2, out2, mean, rstd);
#else
    ACCRUE_FAIL(name, ": a CUDA tensor, but accrue was built without CUDA");
#endif
  }
  return r;
}

}  // namespace accrue::kernels
