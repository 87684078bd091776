// Dispatch of the neural-network kernels of kernels/ops.h: embedding,
// cross-entropy and layer norm, with their index checks.
#include <atomic>
#include <string>
#include <vector>

#include "accrue/kernels/dispatch_util.h"
#include "accrue/kernels/index_checks.h"

namespace accrue::kernels {

// The shared checks and shaping of kernels/dispatch_util.h.
using namespace dispatch_util;

namespace {

std::atomic<bool> g_check_indices{true};

void check_index_dtype(const Tensor& t, const char* op, const char* what) {
  ACCRUE_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, op, ": ", what, " of shape ",
               shape_str(t.shape()), " has dtype ", dtype_name(t.dtype()), "; expected i32 or i64");
}

}  // namespace

void set_check_indices(bool check) {
  g_check_indices.store(check);
}
bool check_indices() {
  return g_check_indices.load();
}

// ---- neural-network kernels ---------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  NoGradGuard no_grad;
  const char* name = "embedding";
  check_defined(weight, name, "weight");
  check_defined(indices, name, "indices");
  check_same_device(weight, indices, name);
  check_floating(weight, name, "weight");
  check_index_dtype(indices, name, "indices");
  ACCRUE_CHECK(weight.dim() == 2, "embedding: weight must be 2-D [V, D], got shape ",
               shape_str(weight.shape()));
  const int64_t v = weight.size(0), d = weight.size(1), n = indices.numel();
  Shape shape = indices.shape();
  shape.push_back(d);
  Tensor out = empty(shape, weight.dtype(), weight.device());
  const Tensor idx = dense_view(indices, {n});
  check_index_range(dense_view(idx, indices.shape()), v, 0, false, name, "index");
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(weight.device(), embedding, weight.contiguous(), idx,
                      dense_view(out, {n, d}));
  return out;
}

void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& grad_weight,
                        bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "embedding_backward";
  check_defined(grad, name, "grad");
  check_defined(indices, name, "indices");
  check_defined(grad_weight, name, "grad_weight");
  check_same_device(grad, indices, name);
  check_same_device(grad, grad_weight, name);
  check_floating(grad, name, "grad");
  check_index_dtype(indices, name, "indices");
  check_dtype_or_f32(grad_weight, grad.dtype(), true, name, "grad_weight");
  ACCRUE_CHECK(grad_weight.dim() == 2, "embedding_backward: grad_weight must be 2-D [V, D], got ",
               shape_str(grad_weight.shape()));
  check_contiguous(grad_weight, name, "grad_weight");
  const int64_t v = grad_weight.size(0), d = grad_weight.size(1), n = indices.numel();
  Shape expected = indices.shape();
  expected.push_back(d);
  ACCRUE_CHECK(grad.shape() == expected, "embedding_backward: grad of shape ",
               shape_str(grad.shape()), " does not match indices of shape ",
               shape_str(indices.shape()), " and grad_weight of shape ",
               shape_str(grad_weight.shape()), " (expected ", shape_str(expected), ")");
  const Tensor idx = dense_view(indices, {n});
  check_index_range(dense_view(idx, indices.shape()), v, 0, false, name, "index");
  if (grad_weight.numel() == 0) return;
  if (n == 0) {
    if (!accumulate) fill(grad_weight, 0.0);
    return;
  }
  ACCRUE_BACKEND_CALL(grad.device(), embedding_backward, dense_view(grad, {n, d}), idx, grad_weight,
                      accumulate);
}

namespace {

// logits [N, C] floating, targets [N] i32/i64, on one device.
void check_cross_entropy_inputs(const Tensor& logits, const Tensor& targets, const char* name) {
  check_defined(logits, name, "logits");
  check_defined(targets, name, "targets");
  check_same_device(logits, targets, name);
  check_floating(logits, name, "logits");
  check_index_dtype(targets, name, "targets");
  ACCRUE_CHECK(logits.dim() == 2, name, ": logits must be 2-D [N, C], got shape ",
               shape_str(logits.shape()));
  ACCRUE_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), name, ": targets of shape ",
               shape_str(targets.shape()), " do not match logits of shape ",
               shape_str(logits.shape()), " (expected [", logits.size(0), "])");
}

}  // namespace

LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  NoGradGuard no_grad;
  const char* name = "cross_entropy";
  check_cross_entropy_inputs(logits, targets, name);
  const Tensor t = targets.contiguous();
  check_index_range(t, logits.size(1), ignore_index, true, name, "target");
  LossSum loss{empty({}, widened(logits.dtype()), logits.device()),
               empty({}, DType::i64, logits.device())};
  if (logits.numel() == 0) {
    // No rows, or no classes (then every target is ignore_index, as checked above).
    loss.sum.fill_(0.0);
    loss.count.fill_(0.0);
    return loss;
  }
  ACCRUE_BACKEND_CALL(logits.device(), cross_entropy, logits.contiguous(), t, ignore_index,
                      loss.sum, loss.count);
  return loss;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& grad_sum) {
  NoGradGuard no_grad;
  const char* name = "cross_entropy_backward";
  check_cross_entropy_inputs(logits, targets, name);
  check_defined(grad_sum, name, "grad_sum");
  check_same_device(logits, grad_sum, name);
  check_floating(grad_sum, name, "grad_sum");
  ACCRUE_CHECK(grad_sum.numel() == 1, name, ": grad_sum must be a 0-d tensor, got shape ",
               shape_str(grad_sum.shape()));
  const Tensor t = targets.contiguous();
  check_index_range(t, logits.size(1), ignore_index, true, name, "target");
  Tensor dx = empty(logits.shape(), logits.dtype(), logits.device());
  if (dx.numel() == 0) return dx;
  const Tensor seed = dense_view(grad_sum, {}).to(widened(logits.dtype()));
  ACCRUE_BACKEND_CALL(logits.device(), cross_entropy_backward, logits.contiguous(), t, ignore_index,
                      seed, dx);
  return dx;
}

namespace {

// weight or bias: undefined, or [D] on x's device, of x's dtype or f32 (fp32
// master weights next to 16-bit activations).
void check_norm_param(const Tensor& p, const Tensor& x, const char* name, const char* what) {
  if (!p.defined()) return;
  check_same_device(p, x, name);
  check_floating(p, name, what);
  check_dtype_or_f32(p, x.dtype(), is_16_bit(x.dtype()), name, what);
  ACCRUE_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), name, ": ", what, " of shape ",
               shape_str(p.shape()), " does not match the normalized dim of input ",
               shape_str(x.shape()), " (expected [", x.size(-1), "])");
}

void check_norm_input(const Tensor& x, const char* name) {
  check_defined(x, name, "input");
  check_floating(x, name, "input");
  ACCRUE_CHECK(x.dim() >= 1 && x.size(-1) > 0, name,
               ": input must have a non-empty last dim to normalize, got shape ",
               shape_str(x.shape()));
}

Tensor contiguous_or_undefined(const Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  NoGradGuard no_grad;
  const char* name = "layer_norm";
  check_norm_input(x, name);
  check_norm_param(weight, x, name, "weight");
  check_norm_param(bias, x, name, "bias");
  ACCRUE_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got ", eps);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const Shape stats_shape(x.shape().begin(), x.shape().end() - 1);
  LayerNormOutput r{empty(x.shape(), x.dtype(), x.device()),
                    empty(stats_shape, widened(x.dtype()), x.device()),
                    empty(stats_shape, widened(x.dtype()), x.device())};
  if (rows == 0) return r;
  ACCRUE_BACKEND_CALL(x.device(), layer_norm, dense_view(x, {rows, d}),
                      contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps,
                      dense_view(r.out, {rows, d}), dense_view(r.mean, {rows}),
                      dense_view(r.rstd, {rows}));
  return r;
}

namespace {

// A parameter gradient LayerNorm's backward writes: [d], f32 or x's dtype,
// contiguous, on `like`'s device; d is the normalized dim of `input`, or of
// the partial sums when there is no input at hand.
void check_param_grad(const Tensor& g, const Tensor& like, DType x_dtype, int64_t d,
                      const Tensor* input, const char* name, const char* what) {
  if (!g.defined()) return;
  check_same_device(g, like, name);
  check_dtype_or_f32(g, x_dtype, true, name, what);
  ACCRUE_CHECK(g.dim() == 1 && g.size(0) == d, name, ": ", what, " of shape ", shape_str(g.shape()),
               " does not match the normalized dim of ",
               input ? "input " + shape_str(input->shape()) : std::string("the partial sums"),
               " (expected [", d, "])");
  check_contiguous(g, name, what);
}

}  // namespace

Tensor layer_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, bool want_dweight,
                                    bool want_dbias, NormPartials* partials, const Tensor& dx_add) {
  NoGradGuard no_grad;
  const char* name = "layer_norm_backward";
  ACCRUE_CHECK(partials != nullptr, name, ": no NormPartials to fill");
  check_norm_input(x, name);
  check_like_input(grad, x, name, "grad");
  if (dx_add.defined()) check_like_input(dx_add, x, name, "dx_add");
  check_norm_param(weight, x, name, "weight");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const DType stats = widened(x.dtype());
  for (const Tensor* s : {&mean, &rstd}) {
    const char* what = s == &mean ? "mean" : "rstd";
    check_defined(*s, name, what);
    check_same_device(*s, x, name);
    ACCRUE_CHECK(s->dtype() == stats && s->numel() == rows, name, ": ", what, " of shape ",
                 shape_str(s->shape()), " and dtype ", dtype_name(s->dtype()),
                 " does not match input ", shape_str(x.shape()), " (expected ", rows, " values of ",
                 dtype_name(stats), ")");
  }
  *partials = NormPartials{};
  partials->x_dtype = x.dtype();
  partials->d = d;
  Tensor dx = empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return dx;  // chunks 0: the totals are zeros
  ACCRUE_BACKEND_CALL(x.device(), layer_norm_backward_partials, dense_view(grad, {rows, d}),
                      dense_view(x, {rows, d}), contiguous_or_undefined(weight),
                      dense_view(mean, {rows}), dense_view(rstd, {rows}), dense_view(dx, {rows, d}),
                      dx_add.defined() ? dense_view(dx_add, {rows, d}) : Tensor(), want_dweight,
                      want_dbias, partials);
  return dx;
}

void norm_param_totals(const NormPartials& partials, const Tensor& dweight, const Tensor& dbias,
                       bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "norm_param_totals";
  for (const Tensor* g : {&dweight, &dbias}) {
    if (!g->defined()) continue;
    const bool is_w = g == &dweight;
    const char* what = is_w ? "dweight" : "dbias";
    const Tensor& sums = is_w ? partials.dweight : partials.dbias;
    ACCRUE_CHECK(partials.chunks == 0 || sums.defined(), name, ": ", what,
                 " was not wanted by layer_norm_backward_partials: it made no partial sums for it");
    check_param_grad(*g, sums.defined() ? sums : *g, partials.x_dtype, partials.d, nullptr, name,
                     what);
  }
  if (partials.chunks == 0) {  // no rows: the sums of nothing
    if (!accumulate) {
      if (dweight.defined()) fill(dweight, 0.0);
      if (dbias.defined()) fill(dbias, 0.0);
    }
    return;
  }
  const Tensor& any = partials.dweight.defined() ? partials.dweight : partials.dbias;
  if (!any.defined() || (!dweight.defined() && !dbias.defined())) return;
  ACCRUE_BACKEND_CALL(any.device(), norm_param_totals, partials, dweight, dbias, accumulate);
}

Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dweight,
                           const Tensor& dbias, bool accumulate) {
  NoGradGuard no_grad;
  const char* name = "layer_norm_backward";
  check_norm_input(x, name);
  const int64_t d = x.size(-1);
  check_param_grad(dweight, x, x.dtype(), d, &x, name, "dweight");
  check_param_grad(dbias, x, x.dtype(), d, &x, name, "dbias");
  NormPartials partials;
  Tensor dx = layer_norm_backward_partials(grad, x, weight, mean, rstd, dweight.defined(),
                                           dbias.defined(), &partials);
  norm_param_totals(partials, dweight, dbias, accumulate);
  return dx;
}

}  // namespace accrue::kernels
