// Dispatch of the elementwise ops of kernels/ops.h: every input raw-expanded
// to the output shape (see Note [Dispatch shapes]), the shapes and dtypes
// checked as Note [Broadcasting and dtypes] (kernels/dispatch_util.h) says.
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "accrue/kernels/dispatch_util.h"

namespace accrue::kernels {

// The shared checks and shaping of kernels/dispatch_util.h.
using namespace dispatch_util;

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::Gelu:
      return "gelu";
    case UnaryOp::Sigmoid:
      return "sigmoid";
    case UnaryOp::Pow:
      return "pow";
    case UnaryOp::Silu:
      return "silu";
    case UnaryOp::Rsqrt:
      return "rsqrt";
    case UnaryOp::Sin:
      return "sin";
    case UnaryOp::Cos:
      return "cos";
    case UnaryOp::Abs:
      return "abs";
  }
  return "unary";
}

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
    case BinaryOp::Min:
      return "minimum";
    case BinaryOp::Max:
      return "maximum";
  }
  return "binary";
}

// ---- elementwise --------------------------------------------------------------------

// Note [Channels-last results]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An elementwise result keeps a channels-last layout (dispatch_util::channels_last):
// when an operand of the result's own shape (not broadcast to it) is
// channels-last, the result is allocated channels-last and the backend sees
// every operand permuted to [N, H, W, C], where the result is contiguous (the
// backend contract) and channels-last operands are contiguous too, the fast
// path. So a channels-last model stays channels-last through its activations
// and residual adds, as PyTorch's memory formats do, instead of being
// transposed back to NCHW at the first elementwise op. Any other result is
// contiguous.
namespace {

bool keeps_channels_last(const Shape& shape, std::initializer_list<const Tensor*> operands) {
  if (shape.size() != 4) return false;
  for (const Tensor* t : operands)
    if (t->defined() && t->shape() == shape && channels_last(*t)) return true;
  return false;
}

Tensor nhwc(const Tensor& t) {
  return t.permute({0, 2, 3, 1});
}

// A fresh result of `shape` for the operands: channels-last or contiguous.
Tensor empty_result(const Shape& shape, DType dtype, Device device,
                    std::initializer_list<const Tensor*> operands) {
  return keeps_channels_last(shape, operands) ? empty_channels_last(shape, dtype, device)
                                              : empty(shape, dtype, device);
}

// What the backend sees of `t` (of the result's shape): permuted to
// [N, H, W, C] when the result is channels-last.
Tensor backend_view(const Tensor& t, const Tensor& out) {
  return out.is_contiguous() ? t : nhwc(t);
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_float_pair(a, b, name, "a", "b");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty_result(shape, a.dtype(), a.device(), {&a, &b});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), binary, op, backend_view(a.expand(shape), out),
                      backend_view(b.expand(shape), out), backend_view(out, out));
  return out;
}

Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_defined(a, name, "a");
  check_floating(a, name, "a");
  Tensor out = empty_result(a.shape(), a.dtype(), a.device(), {&a});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), binary_scalar, op, backend_view(a, out), s, scalar_first,
                      backend_view(out, out));
  return out;
}

Tensor unary(UnaryOp op, const Tensor& a, double param) {
  NoGradGuard no_grad;
  const char* name = op_name(op);
  check_defined(a, name, "input");
  check_floating(a, name, "input");
  Tensor out = empty_result(a.shape(), a.dtype(), a.device(), {&a});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), unary, op, backend_view(a, out), param, backend_view(out, out));
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& input, const Tensor& output,
                      double param) {
  NoGradGuard no_grad;
  const std::string name_s = std::string(op_name(op)) + "_backward";
  const char* name = name_s.c_str();
  check_float_pair(grad, input, name, "grad", "input");
  check_same_shape(grad, input, name, "grad", "input");
  Tensor y = output;
  if (y.defined()) {
    check_same_device(y, input, name, "output", "input");
    check_same_dtype(y, input, name, "output", "input");
    check_same_shape(y, input, name, "output", "input");
  } else {
    y = unary(op, input, param);
  }
  Tensor out = empty_result(input.shape(), input.dtype(), input.device(), {&grad, &input});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(input.device(), unary_backward, op, backend_view(grad, out),
                      backend_view(input, out), backend_view(y, out), param,
                      backend_view(out, out));
  return out;
}

Tensor minmax_backward(BinaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  NoGradGuard no_grad;
  ACCRUE_CHECK(op == BinaryOp::Min || op == BinaryOp::Max,
               "minmax_backward: op must be minimum or maximum, got ", op_name(op));
  const std::string name_s = std::string(op_name(op)) + "_backward";
  const char* name = name_s.c_str();
  check_float_pair(x, y, name, "x", "y");
  check_float_pair(grad, x, name, "grad", "x");
  const Shape shape =
      broadcast_shapes(grad.shape(), broadcast_shapes(x.shape(), y.shape(), name), name);
  Tensor out = empty_result(shape, x.dtype(), x.device(), {&grad, &x, &y});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), minmax_backward, op, backend_view(grad.expand(shape), out),
                      backend_view(x.expand(shape), out), backend_view(y.expand(shape), out),
                      backend_view(out, out));
  return out;
}

namespace {

// clamp's bounds as the backends take them (an absent one infinite), checked.
std::pair<double, double> clamp_bounds(std::optional<double> lo, std::optional<double> hi,
                                       const char* op) {
  ACCRUE_CHECK(lo.has_value() || hi.has_value(), op, ": at least one of min and max must be given");
  ACCRUE_CHECK(!lo || !std::isnan(*lo), op, ": min is NaN");
  ACCRUE_CHECK(!hi || !std::isnan(*hi), op, ": max is NaN");
  ACCRUE_CHECK(!lo || !hi || *lo <= *hi, op, ": min ", *lo, " is greater than max ", *hi);
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {lo.value_or(-inf), hi.value_or(inf)};
}

}  // namespace

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  NoGradGuard no_grad;
  check_defined(x, "clamp", "x");
  check_floating(x, "clamp", "x");
  const auto [l, h] = clamp_bounds(lo, hi, "clamp");
  Tensor out = empty_result(x.shape(), x.dtype(), x.device(), {&x});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), clamp, backend_view(x, out), l, h, backend_view(out, out));
  return out;
}

Tensor clamp_backward(const Tensor& grad, const Tensor& x, std::optional<double> lo,
                      std::optional<double> hi) {
  NoGradGuard no_grad;
  check_float_pair(grad, x, "clamp_backward", "grad", "x");
  check_same_shape(grad, x, "clamp_backward", "grad", "x");
  const auto [l, h] = clamp_bounds(lo, hi, "clamp_backward");
  Tensor out = empty_result(x.shape(), x.dtype(), x.device(), {&grad, &x});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), clamp_backward, backend_view(grad, out), backend_view(x, out), l,
                      h, backend_view(out, out));
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_defined(a, "compare", "a");
  check_defined(b, "compare", "b");
  check_same_device(a, b, "compare", "a", "b");
  check_same_dtype(a, b, "compare", "a", "b");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "compare");
  Tensor out = empty(shape, DType::boolean, a.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), compare, op, a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  check_defined(cond, "where", "cond");
  check_defined(a, "where", "a");
  check_defined(b, "where", "b");
  check_dtype(cond, DType::boolean, "where", "cond");
  check_same_device(cond, a, "where", "cond", "a");
  check_same_device(a, b, "where", "a", "b");
  check_same_dtype(a, b, "where", "a", "b");
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = empty_result(shape, a.dtype(), a.device(), {&a, &b});
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(a.device(), where, backend_view(cond.expand(shape), out),
                      backend_view(a.expand(shape), out), backend_view(b.expand(shape), out),
                      backend_view(out, out));
  return out;
}

namespace {

// A 0-d tensor holding `value` in t's dtype on t's device, the scalar operand
// of where and masked_fill (Note [Broadcasting and dtypes]: a scalar takes the
// tensor's dtype). Raw-expanded to the result's shape it costs no memory.
Tensor scalar_like(const Tensor& t, double value, const char* op, const char* what) {
  check_defined(t, op, what);
  return full({}, value, t.dtype(), t.device());
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, double b) {
  return where(cond, a, scalar_like(a, b, "where", "a"));
}

Tensor where(const Tensor& cond, double a, const Tensor& b) {
  return where(cond, scalar_like(b, a, "where", "b"), b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  NoGradGuard no_grad;
  check_defined(x, "masked_fill", "x");
  check_defined(mask, "masked_fill", "mask");
  check_dtype(mask, DType::boolean, "masked_fill", "mask");
  check_same_device(x, mask, "masked_fill", "x", "mask");
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  ACCRUE_CHECK(shape == x.shape(), "masked_fill: mask of shape ", shape_str(mask.shape()),
               " does not broadcast to x of shape ", shape_str(x.shape()));
  return where(mask, full({}, value, x.dtype(), x.device()), x);
}

namespace {

Tensor triangle(const Tensor& x, int64_t diagonal, bool upper) {
  NoGradGuard no_grad;
  const char* name = upper ? "triu" : "tril";
  check_defined(x, name, "x");
  ACCRUE_CHECK(x.dim() >= 2, name, ": x of shape ", shape_str(x.shape()), " has fewer than 2 dims");
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  ACCRUE_BACKEND_CALL(x.device(), triangle, x, diagonal, upper, out);
  return out;
}

}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) {
  return triangle(x, diagonal, false);
}

Tensor triu(const Tensor& x, int64_t diagonal) {
  return triangle(x, diagonal, true);
}

// Note [Mixed axpy]
// ~~~~~~~~~~~~~~~~~
// axpy_ adds a src of any floating dtype: it is converted to dst's dtype
// first, exactly as src.to(dst.dtype()) would be. A bf16/f16 src into an f32
// dst (a 16-bit gradient landing in its fp32 arena slot) needs no conversion
// pass: both backends widen each element as they read it (exact), so the
// result is bitwise that of the cast and then the add, without the cast's
// pass and its f32 temporary. Other pairs are converted here, then added.
void axpy_(const Tensor& dst, double alpha, const Tensor& src) {
  NoGradGuard no_grad;
  check_defined(dst, "axpy_", "dst");
  check_defined(src, "axpy_", "src");
  check_same_device(dst, src, "axpy_");
  check_floating(dst, "axpy_", "dst");
  check_floating(src, "axpy_", "src");
  const Shape shape = broadcast_shapes(dst.shape(), src.shape(), "axpy_");
  ACCRUE_CHECK(shape == dst.shape(), "axpy_: src of shape ", shape_str(src.shape()),
               " does not broadcast to dst of shape ", shape_str(dst.shape()));
  // An expanded destination would add into one element several times.
  for (int64_t d = 0; d < dst.dim(); ++d)
    ACCRUE_CHECK(dst.shape()[d] <= 1 || dst.strides()[d] != 0, "axpy_: dst of shape ",
                 shape_str(dst.shape()), " and strides ", shape_str(dst.strides()),
                 " overlaps itself (an expanded view)");
  if (dst.numel() == 0) return;
  // Note [Mixed axpy]: a 16-bit src into an f32 dst in one pass; any other
  // pair of dtypes is converted first.
  const bool one_pass =
      src.dtype() == dst.dtype() || (dst.dtype() == DType::f32 && is_16_bit(src.dtype()));
  ACCRUE_BACKEND_CALL(dst.device(), axpy, dst, alpha,
                      (one_pass ? src : src.to(dst.dtype())).expand(shape));
}

}  // namespace accrue::kernels
