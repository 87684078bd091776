// The dispatch point of the fused batch normalization (kernels/batch_norm.h):
// validate, settle the layout, allocate, then run on the input's device.
// See Note [Fused batch norm kernels].
#include "accrue/kernels/batch_norm.h"

#include "accrue/core/grad_mode.h"
#include "accrue/kernels/batch_norm_backend.h"
#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

using namespace dispatch_util;

namespace {

DType accumulation_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// x as one dense buffer: itself when contiguous or channels-last, else a
// contiguous copy; and its [outer, C, inner] reading.
struct Dense {
  Tensor t;
  BatchNormLayout layout;
};
Dense dense(const Tensor& x) {
  const int64_t c = x.size(1);
  if (channels_last(x)) return {x, {x.numel() / c, c, 1}};
  const Tensor t = x.contiguous();
  return {t, {x.size(0), c, x.numel() / (x.size(0) * c)}};
}

// A fresh tensor laid out as `d` (and of its shape).
Tensor empty_like_dense(const Dense& d, DType dtype) {
  return empty_in_layout_of(d.t.shape(), dtype, d.t);
}

// `t` (of d's shape) in d's layout: itself when it already is, else copied.
Tensor in_layout(const Tensor& t, const Dense& d) {
  if (t.strides() == d.t.strides()) return t;
  Tensor copy = empty_like_dense(d, t.dtype());
  copy.copy_(t);
  return copy;
}

void check_input(const Tensor& x, const char* op) {
  check_defined(x, op, "input");
  check_floating(x, op, "input");
  ACCRUE_CHECK(x.dim() >= 2, op, ": input has shape ", shape_str(x.shape()),
               "; expected [N, C, ...] with at least 2 dims");
  const int64_t c = x.size(1);
  ACCRUE_CHECK(c > 0 && x.numel() / c > 1, op,
               ": training needs more than one value per channel, got ", c > 0 ? x.numel() / c : 0,
               " in an input of shape ", shape_str(x.shape()));
}

// A [C] vector of `dtype` on x's device.
void check_channel_vector(const Tensor& v, const Tensor& x, DType dtype, const char* op,
                          const char* what) {
  const int64_t c = x.size(1);
  ACCRUE_CHECK(v.defined() && v.shape() == Shape{c}, op, ": ", what, " has shape ",
               v.defined() ? shape_str(v.shape()) : "(undefined)", "; expected [", c,
               "] (one per channel of input ", shape_str(x.shape()), ")");
  ACCRUE_CHECK(v.dtype() == dtype && v.device() == x.device(), op, ": ", what, " is ",
               dtype_name(v.dtype()), " on ", v.device().str(), "; expected ", dtype_name(dtype),
               " on ", x.device().str(), " (input ", shape_str(x.shape()), ")");
}

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps) {
  const char* op = "batch_norm";
  NoGradGuard no_grad;
  check_input(x, op);
  check_channel_vector(weight, x, x.dtype(), op, "weight");
  check_channel_vector(bias, x, x.dtype(), op, "bias");
  ACCRUE_CHECK(eps > 0.0, op, ": eps = ", eps, " must be > 0");
  const Dense d = dense(x);
  const DType acc = accumulation_dtype(x.dtype());
  const int64_t c = x.size(1);
  BatchNormForward r;
  r.out = empty_like_dense(d, x.dtype());
  r.mean = empty({c}, acc, x.device());
  r.var = empty({c}, acc, x.device());
  r.invstd = empty({c}, acc, x.device());
  const Tensor w = weight.contiguous(), b = bias.contiguous();
  ACCRUE_BACKEND_CALL(x.device(), batch_norm_forward, d.t, w, b, eps, d.layout, r.out, r.mean,
                      r.var, r.invstd);
  return r;
}

BatchNormBackward batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& invstd, bool need_dx) {
  const char* op = "batch_norm_backward";
  NoGradGuard no_grad;
  check_input(x, op);
  check_defined(grad, op, "grad");
  ACCRUE_CHECK(
      grad.shape() == x.shape() && grad.dtype() == x.dtype() && grad.device() == x.device(), op,
      ": grad is ", dtype_name(grad.dtype()), " ", shape_str(grad.shape()), " on ",
      grad.device().str(), "; the input is ", dtype_name(x.dtype()), " ", shape_str(x.shape()),
      " on ", x.device().str());
  const DType acc = accumulation_dtype(x.dtype());
  check_channel_vector(weight, x, x.dtype(), op, "weight");
  check_channel_vector(mean, x, acc, op, "mean");
  check_channel_vector(invstd, x, acc, op, "invstd");
  const Dense d = dense(x);
  const int64_t c = x.size(1);
  BatchNormBackward r;
  if (need_dx) r.dx = empty_like_dense(d, x.dtype());
  r.dweight = empty({c}, acc, x.device());
  r.dbias = empty({c}, acc, x.device());
  ACCRUE_BACKEND_CALL(x.device(), batch_norm_backward, in_layout(grad, d), d.t, weight.contiguous(),
                      mean.contiguous(), invstd.contiguous(), d.layout, r.dx, r.dweight, r.dbias);
  return r;
}

namespace {

// A statistics vector of the merge or adoption: contiguous [n] on `device`,
// f64 (or f32 too where f32_ok).
void check_statistics(const Tensor& t, const char* op, const char* what, int64_t n, Device device,
                      bool f32_ok) {
  ACCRUE_CHECK(t.defined() && t.shape() == Shape{n} && t.device() == device && t.is_contiguous() &&
                   (t.dtype() == DType::f64 || (f32_ok && t.dtype() == DType::f32)),
               op, ": ", what, " is ", t.defined() ? dtype_name(t.dtype()) : "undefined", " ",
               t.defined() ? shape_str(t.shape()) : "", " on ",
               t.defined() ? t.device().str() : "-", "; expected contiguous ",
               f32_ok ? "f32 or f64" : "f64", " [", n, "] on ", device.str());
}

}  // namespace

void batch_norm_adopt_statistics(const Tensor& running_mean, const Tensor& running_var,
                                 const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 double momentum) {
  const char* op = "batch_norm_adopt_statistics";
  NoGradGuard no_grad;
  check_defined(mean, op, "mean");
  const int64_t c = mean.numel();
  const Device device = mean.device();
  check_statistics(running_mean, op, "running_mean", c, device, false);
  check_statistics(running_var, op, "running_var", c, device, false);
  check_statistics(count, op, "count", 1, device, false);
  check_statistics(mean, op, "mean", c, device, false);
  check_statistics(m2, op, "m2", c, device, false);
  ACCRUE_CHECK(momentum > 0.0 && momentum <= 1.0, op, ": momentum = ", momentum,
               " must lie in (0, 1]");
  ACCRUE_BACKEND_CALL(device, batch_norm_adopt_statistics, running_mean, running_var, count, mean,
                      m2, momentum);
}

void batch_norm_merge_statistics(const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 const Tensor& batch_mean, const Tensor& batch_var,
                                 double batch_count) {
  const char* op = "batch_norm_merge_statistics";
  NoGradGuard no_grad;
  check_defined(mean, op, "mean");
  const int64_t c = mean.numel();
  const Device device = mean.device();
  check_statistics(count, op, "count", 1, device, false);
  check_statistics(mean, op, "mean", c, device, false);
  check_statistics(m2, op, "m2", c, device, false);
  check_statistics(batch_mean, op, "batch_mean", c, device, true);
  check_statistics(batch_var, op, "batch_var", c, device, true);
  ACCRUE_CHECK(batch_mean.dtype() == batch_var.dtype(), op, ": batch_mean is ",
               dtype_name(batch_mean.dtype()), ", batch_var ", dtype_name(batch_var.dtype()));
  ACCRUE_CHECK(batch_count >= 1.0, op, ": batch_count = ", batch_count, " must be >= 1");
  ACCRUE_BACKEND_CALL(device, batch_norm_merge_statistics, count, mean, m2, batch_mean, batch_var,
                      batch_count);
}

}  // namespace accrue::kernels
