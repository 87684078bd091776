// Differentiable elementwise ops.
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/saved.h"
#include "accrue/kernels/ops.h"

namespace accrue {

using autograd::record;
using autograd::saved;
using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

Tensor binary_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(op, a, b);
  const bool ga = autograd::wants_grad(a), gb = autograd::wants_grad(b);
  // Each backward keeps only what its formula reads: Add and Sub nothing, Mul
  // the other operand, Div the divisor and the output. Saving all three made
  // every residual add of a ResNet hold both its inputs and its output until
  // the backward reached it (24 MiB per 224 x 224 image in ResNet-50, a third
  // of its activations).
  const bool mul = op == BinaryOp::Mul, div = op == BinaryOp::Div;
  const Tensor sa = mul && gb ? saved(a) : Tensor();
  const Tensor sb = (mul && ga) || div ? saved(b) : Tensor();
  const Tensor so = div && gb ? saved(out) : Tensor();
  const Shape shape_a = a.shape(), shape_b = b.shape();
  return record(name, out, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor da, db;
    switch (op) {
      case BinaryOp::Add:
        if (ga) da = kernels::sum_to(g, shape_a);
        if (gb) db = kernels::sum_to(g, shape_b);
        break;
      case BinaryOp::Sub:
        if (ga) da = kernels::sum_to(g, shape_a);
        if (gb) db = kernels::sum_to(kernels::unary(UnaryOp::Neg, g), shape_b);
        break;
      case BinaryOp::Mul:
        if (ga) da = kernels::sum_to(kernels::binary(BinaryOp::Mul, g, sb), shape_a);
        if (gb) db = kernels::sum_to(kernels::binary(BinaryOp::Mul, g, sa), shape_b);
        break;
      case BinaryOp::Div:
        // d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b.
        if (ga) da = kernels::sum_to(kernels::binary(BinaryOp::Div, g, sb), shape_a);
        if (gb) {
          Tensor t = kernels::binary(BinaryOp::Div, kernels::binary(BinaryOp::Mul, g, so), sb);
          db = kernels::sum_to(kernels::unary(UnaryOp::Neg, t), shape_b);
        }
        break;
      case BinaryOp::Min:
      case BinaryOp::Max:
        break;  // minimum and maximum record their own node (minmax_op)
    }
    return {da, db};
  });
}

// Note [Unary op saves]
// ~~~~~~~~~~~~~~~~~~~~~
// The derivative of each unary op reads its input or its output, never both
// (kernels::unary_backward reads the output for Exp, Sqrt, Tanh, Sigmoid and
// Rsqrt, the input for the others), so the node saves that one tensor and
// passes it as both. Saving both kept every GELU output of a GPT-2 alive
// beside the one-byte FP8 codes the next layer saves of it: the FP8 model's
// peak was 7% above bf16's (a 4-layer d256 GPT-2 on the CPU, 156.2 MB
// against 143.6 MB).
bool derivative_reads_output(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Rsqrt:
      return true;
    default:
      return false;
  }
}

Tensor unary_op(UnaryOp op, const char* name, const Tensor& a, double param = 0.0) {
  Tensor out = kernels::unary(op, a, param);
  Tensor s = saved(derivative_reads_output(op) ? out : a);
  return record(name, out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::unary_backward(op, g, s, s, param)};
  });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Add, "AddBackward", a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Sub, "SubBackward", a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Mul, "MulBackward", a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Div, "DivBackward", a, b);
}

Tensor add(const Tensor& a, double s) {
  return record("AddScalarBackward", kernels::binary_scalar(BinaryOp::Add, a, s), {a},
                [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("MulScalarBackward", kernels::binary_scalar(BinaryOp::Mul, a, s), {a},
                [s](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::binary_scalar(BinaryOp::Mul, g, s)};
                });
}

Tensor sub(double s, const Tensor& a) {
  return record(
      "RsubScalarBackward", kernels::binary_scalar(BinaryOp::Sub, a, s, true), {a},
      [](const Tensor& g) -> std::vector<Tensor> { return {kernels::unary(UnaryOp::Neg, g)}; });
}

Tensor div(double s, const Tensor& a) {
  // d(s/a)/da = -s/a^2 = -out/a.
  Tensor out = kernels::binary_scalar(BinaryOp::Div, a, s, true);
  Tensor sa = saved(a), so = saved(out);
  return record("RdivScalarBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor t = kernels::binary(BinaryOp::Div, kernels::binary(BinaryOp::Mul, g, so), sa);
    return {kernels::unary(UnaryOp::Neg, t)};
  });
}

Tensor neg(const Tensor& a) {  // d(-a) = -1: nothing saved
  return record(
      "NegBackward", kernels::unary(UnaryOp::Neg, a), {a},
      [](const Tensor& g) -> std::vector<Tensor> { return {kernels::unary(UnaryOp::Neg, g)}; });
}
Tensor exp(const Tensor& a) {
  return unary_op(UnaryOp::Exp, "ExpBackward", a);
}
Tensor log(const Tensor& a) {
  return unary_op(UnaryOp::Log, "LogBackward", a);
}
Tensor sqrt(const Tensor& a) {
  return unary_op(UnaryOp::Sqrt, "SqrtBackward", a);
}
Tensor tanh(const Tensor& a) {
  return unary_op(UnaryOp::Tanh, "TanhBackward", a);
}
// relu'(a) is (a > 0), which is (relu(a) > 0): the node saves only the
// output, which the next layer usually saves anyway (a convolution's or a
// matmul's input), so a ReLU adds no activation of its own to the memory a
// model keeps for backward.
Tensor relu(const Tensor& a) {
  Tensor out = kernels::unary(UnaryOp::Relu, a, 0.0);
  Tensor so = saved(out);
  return record("ReluBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::unary_backward(UnaryOp::Relu, g, so, so, 0.0)};
  });
}
Tensor gelu(const Tensor& a) {
  return unary_op(UnaryOp::Gelu, "GeluBackward", a);
}
Tensor sigmoid(const Tensor& a) {
  return unary_op(UnaryOp::Sigmoid, "SigmoidBackward", a);
}
Tensor pow(const Tensor& a, double exponent) {
  return unary_op(UnaryOp::Pow, "PowBackward", a, exponent);
}

Tensor silu(const Tensor& a) {
  return unary_op(UnaryOp::Silu, "SiluBackward", a);
}
Tensor rsqrt(const Tensor& a) {
  return unary_op(UnaryOp::Rsqrt, "RsqrtBackward", a);
}
Tensor sin(const Tensor& a) {
  return unary_op(UnaryOp::Sin, "SinBackward", a);
}
Tensor cos(const Tensor& a) {
  return unary_op(UnaryOp::Cos, "CosBackward", a);
}
Tensor abs(const Tensor& a) {
  return unary_op(UnaryOp::Abs, "AbsBackward", a);
}

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  Tensor out = kernels::clamp(a, lo, hi);
  Tensor sa = saved(a);
  return record("ClampBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::clamp_backward(g, sa, lo, hi)};
  });
}

namespace {

Tensor minmax_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(op, a, b);
  const bool ga = autograd::wants_grad(a), gb = autograd::wants_grad(b);
  Tensor sa = ga || gb ? saved(a) : Tensor(), sb = ga || gb ? saved(b) : Tensor();
  const Shape shape_a = a.shape(), shape_b = b.shape();
  return record(name, out, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor da, db;
    if (ga) da = kernels::sum_to(kernels::minmax_backward(op, g, sa, sb), shape_a);
    if (gb) db = kernels::sum_to(kernels::minmax_backward(op, g, sb, sa), shape_b);
    return {da, db};
  });
}

}  // namespace

Tensor minimum(const Tensor& a, const Tensor& b) {
  return minmax_op(BinaryOp::Min, "MinimumBackward", a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return minmax_op(BinaryOp::Max, "MaximumBackward", a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where(cond, a, b);
  Tensor sc = saved(cond);
  const Shape shape_a = a.shape(), shape_b = b.shape();
  const bool ga = autograd::wants_grad(a), gb = autograd::wants_grad(b);
  return record("WhereBackward", out, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor zero = zeros({}, g.dtype(), g.device());
    Tensor da, db;
    if (ga) da = kernels::sum_to(kernels::where(sc, g, zero), shape_a);
    if (gb) db = kernels::sum_to(kernels::where(sc, zero, g), shape_b);
    return {da, db};
  });
}

namespace {

// where with one tensor operand t, taken where cond is `t_where` (true when t
// is a); the scalar operand gets no gradient.
Tensor where_scalar(const Tensor& cond, const Tensor& t, double s, bool t_where) {
  Tensor out = t_where ? kernels::where(cond, t, s) : kernels::where(cond, s, t);
  Tensor sc = saved(cond);
  const Shape shape_t = t.shape();
  return record("WhereScalarBackward", out, {t}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::sum_to(t_where ? kernels::where(sc, g, 0.0) : kernels::where(sc, 0.0, g),
                            shape_t)};
  });
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, double b) {
  return where_scalar(cond, a, b, true);
}
Tensor where(const Tensor& cond, double a, const Tensor& b) {
  return where_scalar(cond, b, a, false);
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  Tensor out = kernels::masked_fill(a, mask, value);
  Tensor sm = saved(mask);
  return record("MaskedFillBackward", out, {a}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::masked_fill(g, sm, 0.0)};
  });
}

// The gradient of a triangle is the same triangle of the gradient.
Tensor tril(const Tensor& a, int64_t diagonal) {
  return record(
      "TrilBackward", kernels::tril(a, diagonal), {a},
      [diagonal](const Tensor& g) -> std::vector<Tensor> { return {kernels::tril(g, diagonal)}; });
}
Tensor triu(const Tensor& a, int64_t diagonal) {
  return record(
      "TriuBackward", kernels::triu(a, diagonal), {a},
      [diagonal](const Tensor& g) -> std::vector<Tensor> { return {kernels::triu(g, diagonal)}; });
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}
Tensor operator+(const Tensor& a, double s) {
  return add(a, s);
}
Tensor operator-(const Tensor& a, double s) {
  return add(a, -s);
}
Tensor operator*(const Tensor& a, double s) {
  return mul(a, s);
}
Tensor operator/(const Tensor& a, double s) {
  // A true division (not a * (1/s)), so that a/n matches the reference bit for bit.
  return record("DivScalarBackward", kernels::binary_scalar(BinaryOp::Div, a, s), {a},
                [s](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::binary_scalar(BinaryOp::Div, g, s)};
                });
}
Tensor operator+(double s, const Tensor& a) {
  return add(a, s);
}
Tensor operator-(double s, const Tensor& a) {
  return sub(s, a);
}
Tensor operator*(double s, const Tensor& a) {
  return mul(a, s);
}
Tensor operator/(double s, const Tensor& a) {
  return div(s, a);
}

}  // namespace accrue
