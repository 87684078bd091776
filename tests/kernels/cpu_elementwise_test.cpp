// The CPU elementwise kernels (binary, scalar, unary and their gradients,
// compare, where, axpy_) through kernels/ops.h, each against an independent
// f64 loop written here or against hand-computed values.
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;
using test::all_close;
using test::all_equal;
using ::testing::HasSubstr;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

Tensor f64_tensor(const std::vector<double>& v, const Shape& shape) {
  return from_vector<double>(v, shape, DType::f64);
}

// The element of `v` (row-major, shape `shape`) that numpy broadcasting maps
// to the linear index `linear` of `out`.
double broadcast_at(const std::vector<double>& v, const Shape& shape, const Shape& out,
                    int64_t linear) {
  int64_t index = 0, stride = 1;
  const int64_t lead = static_cast<int64_t>(out.size() - shape.size());
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t i = linear % out[d];
    linear /= out[d];
    const int64_t sd = d - lead;
    if (sd < 0) continue;
    if (shape[sd] != 1) index += i * stride;
    stride *= shape[sd];
  }
  return v[index];
}

// f(a, b) over the numpy broadcast of a and b, in f64.
Tensor reference_binary(const Tensor& a, const Tensor& b, const Shape& out,
                        const std::function<double(double, double)>& f) {
  const std::vector<double> va = values(a), vb = values(b);
  std::vector<double> r(static_cast<size_t>(shape_numel(out)));
  for (int64_t i = 0; i < static_cast<int64_t>(r.size()); ++i)
    r[i] = f(broadcast_at(va, a.shape(), out, i), broadcast_at(vb, b.shape(), out, i));
  return f64_tensor(r, out);
}

Tensor reference_unary(const Tensor& a, const std::function<double(double)>& f) {
  std::vector<double> r = values(a);
  for (double& x : r)
    x = f(x);
  return f64_tensor(r, a.shape());
}

std::function<double(double, double)> binary_fn(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return [](double x, double y) { return x + y; };
    case BinaryOp::Sub:
      return [](double x, double y) { return x - y; };
    case BinaryOp::Mul:
      return [](double x, double y) { return x * y; };
    case BinaryOp::Div:
      return [](double x, double y) { return x / y; };
    case BinaryOp::Min:
      return
          [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y); };
    case BinaryOp::Max:
      return
          [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); };
  }
  return nullptr;
}

const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// f(x) for each unary op, in f64 (p is Pow's exponent).
double unary_ref(UnaryOp op, double x, double p) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Relu:
      return x > 0 ? x : 0.0;
    case UnaryOp::Gelu:
      return gelu_ref(x);
    case UnaryOp::Sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::Pow:
      return std::pow(x, p);
    case UnaryOp::Silu:
      return x / (1.0 + std::exp(-x));
    case UnaryOp::Rsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryOp::Sin:
      return std::sin(x);
    case UnaryOp::Cos:
      return std::cos(x);
    case UnaryOp::Abs:
      return x < 0 ? -x : x;
  }
  return 0;
}

const UnaryOp kUnaryOps[] = {UnaryOp::Neg,  UnaryOp::Exp,  UnaryOp::Log,   UnaryOp::Sqrt,
                             UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Gelu,  UnaryOp::Sigmoid,
                             UnaryOp::Pow,  UnaryOp::Silu, UnaryOp::Rsqrt, UnaryOp::Sin,
                             UnaryOp::Cos,  UnaryOp::Abs};

// Inputs in each op's domain: positive for log, sqrt, rsqrt and a fractional pow.
Tensor unary_input(UnaryOp op, const Shape& shape, DType dtype) {
  if (op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Pow || op == UnaryOp::Rsqrt)
    return test::random_uniform(shape, 0.5, 3.0, dtype);
  return test::random_normal(shape, dtype, Device::cpu(), 2.0);
}

// ---- binary ---------------------------------------------------------------------

TEST(CpuBinary, every_op_matches_f64_reference_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + kernels::op_name(op));
      Tensor a = test::random_normal({3, 5}, dt);
      Tensor b = op == BinaryOp::Div ? test::random_uniform({3, 5}, 0.5, 2.0, dt)
                                     : test::random_normal({3, 5}, dt);
      Tensor out = kernels::binary(op, a, b);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(out.is_contiguous());
      EXPECT_TRUE(all_close(out, reference_binary(a, b, {3, 5}, binary_fn(op))));
    }
  }
}

TEST(CpuBinary, small_integers_are_exact_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = test::random_integers({4, 6}, -8, 8, dt);
    Tensor b = test::random_integers({4, 6}, -8, 8, dt);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul})
      EXPECT_TRUE(
          all_equal(kernels::binary(op, a, b), reference_binary(a, b, {4, 6}, binary_fn(op))));
  }
}

TEST(CpuBinary, broadcasts_size_one_and_leading_dims) {
  Tensor a = test::random_integers({2, 1, 4}, -9, 9, DType::f32);
  Tensor b = test::random_integers({3, 1}, -9, 9, DType::f32);
  Tensor out = kernels::binary(BinaryOp::Mul, a, b);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(all_equal(out, reference_binary(a, b, {2, 3, 4}, binary_fn(BinaryOp::Mul))));
  // And the other way round, with a leading dim on b only.
  Tensor c = test::random_normal({5, 2, 3, 1}, DType::f64);
  Tensor d = test::random_normal({3, 4}, DType::f64);
  EXPECT_TRUE(all_close(kernels::binary(BinaryOp::Sub, d, c),
                        reference_binary(d, c, {5, 2, 3, 4}, binary_fn(BinaryOp::Sub))));
}

TEST(CpuBinary, zero_dim_operands) {
  Tensor s = scalar_tensor(2.5);
  Tensor v = from_vector<float>({1, 2, 3}, {3});
  Tensor out = kernels::binary(BinaryOp::Sub, s, v);
  EXPECT_EQ(out.shape(), (Shape{3}));
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1.5f, 0.5f, -0.5f}));
  Tensor both = kernels::binary(BinaryOp::Mul, s, scalar_tensor(4.0));
  EXPECT_EQ(both.dim(), 0);
  EXPECT_EQ(both.item(), 10.0);
}

TEST(CpuBinary, empty_operands_give_empty_results) {
  Tensor out = kernels::binary(BinaryOp::Add, zeros({0, 3}), ones({3}));
  EXPECT_EQ(out.shape(), (Shape{0, 3}));
  EXPECT_EQ(kernels::binary(BinaryOp::Div, zeros({2, 0}), ones({1})).shape(), (Shape{2, 0}));
  EXPECT_EQ(kernels::binary(BinaryOp::Add, zeros({0}), ones({})).shape(), (Shape{0}));
}

TEST(CpuBinary, non_contiguous_inputs) {
  Tensor base = test::random_normal({4, 6}, DType::f32);
  Tensor transposed = base.transpose(0, 1);  // [6, 4], strides [1, 6]
  Tensor narrowed = test::random_normal({6, 9}, DType::f32).narrow(1, 2, 4);  // row stride 9
  Tensor expanded = test::random_normal({6, 1}, DType::f32).expand({6, 4});   // stride 0
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul}) {
    EXPECT_TRUE(all_close(kernels::binary(op, transposed, narrowed),
                          reference_binary(transposed, narrowed, {6, 4}, binary_fn(op))));
    EXPECT_TRUE(all_close(kernels::binary(op, expanded, transposed),
                          reference_binary(expanded, transposed, {6, 4}, binary_fn(op))));
  }
}

TEST(CpuBinary, scalar_on_either_side) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = test::random_uniform({2, 3}, 0.5, 2.0, dt);
    const double s = 1.75;
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
      auto f = binary_fn(op);
      EXPECT_TRUE(all_close(kernels::binary_scalar(op, a, s),
                            reference_unary(a, [&](double x) { return f(x, s); })));
      EXPECT_TRUE(all_close(kernels::binary_scalar(op, a, s, true),
                            reference_unary(a, [&](double x) { return f(s, x); })));
    }
  }
  // Strided input and a 0-d input.
  Tensor t = test::random_normal({3, 4}, DType::f64).transpose(0, 1);
  EXPECT_TRUE(all_close(kernels::binary_scalar(BinaryOp::Sub, t, 3.0, true),
                        reference_unary(t, [](double x) { return 3.0 - x; })));
  EXPECT_EQ(kernels::binary_scalar(BinaryOp::Div, scalar_tensor(3.0), 2.0).item(), 1.5);
  EXPECT_EQ(kernels::binary_scalar(BinaryOp::Mul, zeros({0, 2}), 2.0).shape(), (Shape{0, 2}));
}

TEST(CpuBinary, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::binary(BinaryOp::Add, zeros({2, 3}), zeros({4})), "add", "[2, 3]", "[4]",
               "cannot be broadcast");
  EXPECT_ERROR(kernels::binary(BinaryOp::Mul, zeros({2}), zeros({2}, DType::bf16)), "mul",
               "dtypes f32 and bf16 differ");
  EXPECT_ERROR(kernels::binary(BinaryOp::Sub, zeros({2}, DType::i64), zeros({2}, DType::i64)),
               "sub", "i64", "floating");
  EXPECT_ERROR(kernels::binary(BinaryOp::Div, Tensor(), zeros({2})), "div", "undefined");
  EXPECT_ERROR(kernels::binary_scalar(BinaryOp::Add, zeros({2}, DType::i32), 1.0), "add", "i32",
               "[2]");
}

// ---- unary --------------------------------------------------------------------------

TEST(CpuUnary, every_op_matches_f64_reference_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    for (UnaryOp op : kUnaryOps) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + kernels::op_name(op));
      const double p = 2.5;
      Tensor a = unary_input(op, {4, 7}, dt);
      Tensor out = kernels::unary(op, a, p);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(
          all_close(out, reference_unary(a, [&](double x) { return unary_ref(op, x, p); })));
    }
  }
}

TEST(CpuUnary, hand_computed_values) {
  Tensor x = from_vector<double>({-1.0, 0.0, 2.0}, {3});
  EXPECT_EQ(kernels::unary(UnaryOp::Relu, x).to_vector<double>(), (std::vector<double>{0, 0, 2}));
  EXPECT_EQ(kernels::unary(UnaryOp::Pow, x, 3.0).to_vector<double>(),
            (std::vector<double>{-1, 0, 8}));
  EXPECT_EQ(kernels::unary(UnaryOp::Sigmoid, x).to_vector<double>()[1], 0.5);
  EXPECT_EQ(kernels::unary(UnaryOp::Gelu, x).to_vector<double>()[1], 0.0);
  // GELU(1) in the tanh form, from the formula by hand: 0.5 * (1 + tanh(0.79788456 * 1.044715)).
  EXPECT_NEAR(kernels::unary(UnaryOp::Gelu, from_vector<double>({1.0}, {1})).item(),
              0.8411919906082768, 1e-15);
}

TEST(CpuUnary, strided_zero_dim_and_empty_inputs) {
  Tensor t = test::random_normal({5, 3}, DType::f32).transpose(0, 1);
  EXPECT_TRUE(all_close(kernels::unary(UnaryOp::Tanh, t),
                        reference_unary(t, [](double x) { return std::tanh(x); })));
  Tensor e = test::random_normal({3, 1}, DType::f32).expand({3, 4});
  EXPECT_TRUE(all_close(kernels::unary(UnaryOp::Exp, e),
                        reference_unary(e, [](double x) { return std::exp(x); })));
  Tensor s = kernels::unary(UnaryOp::Sqrt, scalar_tensor(9.0, DType::f64));
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 3.0);
  EXPECT_EQ(kernels::unary(UnaryOp::Log, zeros({0, 4})).shape(), (Shape{0, 4}));
}

// grad * f'(x) from the f64 derivative formulas, checked in turn against
// central differences of the f64 forward.
TEST(CpuUnary, backward_matches_derivative_and_finite_differences) {
  const double p = 2.5;
  for (UnaryOp op : kUnaryOps) {
    SCOPED_TRACE(kernels::op_name(op));
    Tensor x = unary_input(op, {3, 4}, DType::f64);
    Tensor g = test::random_normal({3, 4}, DType::f64);
    Tensor dx = kernels::unary_backward(op, g, x, kernels::unary(op, x, p), p);
    const std::vector<double> vx = values(x), vg = values(g);
    std::vector<double> fd(vx.size());
    const double h = 1e-6;
    for (size_t i = 0; i < vx.size(); ++i)
      fd[i] = vg[i] * (unary_ref(op, vx[i] + h, p) - unary_ref(op, vx[i] - h, p)) / (2 * h);
    EXPECT_TRUE(all_close(dx, f64_tensor(fd, {3, 4}), 1e-6, 1e-7));
  }
}

TEST(CpuUnary, backward_in_every_dtype_and_without_output) {
  const double p = 3.0;
  for (DType dt : kFloatTypes) {
    for (UnaryOp op : kUnaryOps) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + kernels::op_name(op));
      Tensor x = unary_input(op, {2, 5}, dt);
      Tensor g = test::random_normal({2, 5}, dt);
      Tensor with_output = kernels::unary_backward(op, g, x, kernels::unary(op, x, p), p);
      Tensor without = kernels::unary_backward(op, g, x, Tensor(), p);
      EXPECT_TRUE(all_equal(with_output, without));
      // Reference from the derivative computed by central differences in f64 on the
      // rounded inputs: the kernel's own rounding is within the dtype tolerance.
      const std::vector<double> vx = values(x), vg = values(g);
      std::vector<double> r(vx.size());
      for (size_t i = 0; i < vx.size(); ++i) {
        const double h = 1e-6;
        r[i] = vg[i] * (unary_ref(op, vx[i] + h, p) - unary_ref(op, vx[i] - h, p)) / (2 * h);
      }
      // Finite differences carry ~1e-9 error; f32 adds the derivative's own rounding.
      const double extra = dt == DType::f32 ? 1e-4 : dt == DType::f64 ? 1e-7 : 0.0;
      EXPECT_TRUE(all_close(with_output, f64_tensor(r, {2, 5}), test::default_rtol(dt) + extra,
                            test::default_atol(dt) + extra));
    }
  }
}

TEST(CpuUnary, pow_with_exponent_zero_has_zero_gradient_even_at_zero) {
  Tensor x = from_vector<double>({0.0, 2.0}, {2});
  Tensor g = from_vector<double>({1.0, 1.0}, {2});
  EXPECT_EQ(kernels::unary_backward(UnaryOp::Pow, g, x, Tensor(), 0.0).to_vector<double>(),
            (std::vector<double>{0.0, 0.0}));
}

TEST(CpuUnary, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::unary(UnaryOp::Exp, zeros({2, 2}, DType::i64)), "exp", "i64", "[2, 2]");
  EXPECT_ERROR(kernels::unary(UnaryOp::Tanh, Tensor()), "tanh", "undefined");
  EXPECT_ERROR(kernels::unary_backward(UnaryOp::Tanh, zeros({2, 3}), zeros({3, 2}), Tensor()),
               "tanh_backward", "[2, 3]", "[3, 2]");
  EXPECT_ERROR(kernels::unary_backward(UnaryOp::Relu, zeros({2}), zeros({2}, DType::f64), Tensor()),
               "relu_backward", "dtypes f32 and f64 differ");
  EXPECT_ERROR(kernels::unary_backward(UnaryOp::Exp, zeros({2}), zeros({2}), zeros({3})),
               "exp_backward", "[3]", "[2]");
}

// ---- compare and where ------------------------------------------------------------------

TEST(CpuCompare, every_op_with_ties_and_broadcasting) {
  const std::pair<CompareOp, std::function<bool(double, double)>> ops[] = {
      {CompareOp::Eq, [](double x, double y) { return x == y; }},
      {CompareOp::Ne, [](double x, double y) { return x != y; }},
      {CompareOp::Lt, [](double x, double y) { return x < y; }},
      {CompareOp::Le, [](double x, double y) { return x <= y; }},
      {CompareOp::Gt, [](double x, double y) { return x > y; }},
      {CompareOp::Ge, [](double x, double y) { return x >= y; }}};
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(dt));
    // Small integers make ties frequent.
    Tensor a = test::random_integers({3, 4}, -2, 2, DType::f64).to(dt);
    Tensor b = test::random_integers({4}, -2, 2, DType::f64).to(dt);
    for (const auto& [op, f] : ops) {
      Tensor out = kernels::compare(op, a, b);
      EXPECT_EQ(out.dtype(), DType::boolean);
      Tensor expected =
          reference_binary(a, b, {3, 4}, [&](double x, double y) { return f(x, y) ? 1.0 : 0.0; });
      EXPECT_TRUE(all_equal(out, expected));
    }
  }
  // Large i64 values compare exactly (no detour through float).
  Tensor big = from_vector<int64_t>({(int64_t{1} << 60) + 1}, {1});
  Tensor big2 = from_vector<int64_t>({int64_t{1} << 60}, {1});
  EXPECT_EQ(kernels::compare(CompareOp::Gt, big, big2).to_vector<bool>()[0], true);
  EXPECT_EQ(kernels::compare(CompareOp::Lt, zeros({0}), zeros({1})).shape(), (Shape{0}));
}

TEST(CpuWhere, selects_with_broadcasting) {
  Tensor cond = from_vector<int32_t>({1, 0, 1}, {3, 1}, DType::boolean);
  Tensor a = test::random_normal({1, 4}, DType::f32);
  Tensor b = scalar_tensor(-7.0);
  Tensor out = kernels::where(cond, a, b);
  EXPECT_EQ(out.shape(), (Shape{3, 4}));
  const std::vector<double> va = values(a), vo = values(out);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(vo[i * 4 + j], i == 1 ? -7.0 : va[j]);
  // Integer payloads and a strided a.
  Tensor ia = arange(0, 6).view({2, 3}).transpose(0, 1);  // [3, 2]
  Tensor ib = full({3, 2}, -1, DType::i64);
  Tensor ic = from_vector<int32_t>({1, 0}, {2}, DType::boolean);
  EXPECT_EQ(kernels::where(ic, ia, ib).to_vector<int64_t>(),
            (std::vector<int64_t>{0, -1, 1, -1, 2, -1}));
}

TEST(CpuCompareWhere, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::compare(CompareOp::Eq, zeros({2}), zeros({2}, DType::i64)), "compare",
               "dtypes f32 and i64 differ");
  EXPECT_ERROR(kernels::compare(CompareOp::Lt, zeros({2}), zeros({3})), "compare", "[2]", "[3]");
  EXPECT_ERROR(kernels::where(zeros({2}), zeros({2}), zeros({2})), "where", "cond", "f32", "bool");
  EXPECT_ERROR(
      kernels::where(from_vector<int32_t>({1}, {1}, DType::boolean), zeros({2}), zeros({3})),
      "where", "[2]", "[3]");
  EXPECT_ERROR(kernels::where(from_vector<int32_t>({1}, {1}, DType::boolean), zeros({2}),
                              zeros({2}, DType::f64)),
               "where", "dtypes f32 and f64 differ");
}

// ---- silu, rsqrt, sin, cos, abs ------------------------------------------------------
// (Their values and gradients on random inputs are in the every-op tests above.)

TEST(CpuUnary, silu_rsqrt_sin_cos_abs_hand_computed_values) {
  const Tensor x = from_vector<double>({-2.0, 0.0, 4.0}, {3});
  EXPECT_EQ(values(kernels::unary(UnaryOp::Abs, x)), (std::vector<double>{2, 0, 4}));
  EXPECT_EQ(values(kernels::unary(UnaryOp::Rsqrt, from_vector<double>({4.0, 0.25}, {2}))),
            (std::vector<double>{0.5, 2.0}));
  EXPECT_EQ(values(kernels::unary(UnaryOp::Silu, x))[1], 0.0);
  EXPECT_EQ(values(kernels::unary(UnaryOp::Sin, x))[1], 0.0);
  EXPECT_EQ(values(kernels::unary(UnaryOp::Cos, x))[1], 1.0);
  // silu(4) = 4 / (1 + e^-4).
  EXPECT_NEAR(values(kernels::unary(UnaryOp::Silu, x))[2], 3.928055160151634, 1e-15);
  // abs'(0) = 0, as PyTorch's sign; abs'(x) = sign(x) elsewhere.
  const Tensor g = from_vector<double>({3.0, 3.0, 3.0}, {3});
  EXPECT_EQ(values(kernels::unary_backward(UnaryOp::Abs, g, x, Tensor())),
            (std::vector<double>{-3, 0, 3}));
  EXPECT_TRUE(std::isinf(kernels::unary(UnaryOp::Rsqrt, scalar_tensor(0.0, DType::f64)).item()));
  EXPECT_TRUE(std::isnan(kernels::unary(UnaryOp::Abs, scalar_tensor(NAN)).item()));
}

TEST(CpuUnary, bad_inputs_of_the_new_ops_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::unary(UnaryOp::Silu, zeros({2, 3}, DType::i64)), "silu", "i64", "[2, 3]");
  EXPECT_ERROR(kernels::unary(UnaryOp::Rsqrt, Tensor()), "rsqrt", "undefined");
  EXPECT_ERROR(kernels::unary(UnaryOp::Sin, zeros({2}, DType::boolean)), "sin", "bool");
  EXPECT_ERROR(kernels::unary_backward(UnaryOp::Cos, zeros({2, 3}), zeros({3, 2}), Tensor()),
               "cos_backward", "[2, 3]", "[3, 2]");
  EXPECT_ERROR(kernels::unary_backward(UnaryOp::Abs, zeros({2}, DType::bf16), zeros({2}), Tensor()),
               "abs_backward", "dtypes bf16 and f32 differ", "convert input");
}

TEST(CpuUnary, channels_last_and_strided_inputs_of_the_new_ops) {
  for (UnaryOp op : {UnaryOp::Silu, UnaryOp::Rsqrt, UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Abs}) {
    SCOPED_TRACE(kernels::op_name(op));
    const Tensor x = test::as_channels_last(unary_input(op, {2, 3, 4, 5}, DType::f32));
    const Tensor y = kernels::unary(op, x);
    EXPECT_TRUE(y.is_channels_last());
    EXPECT_TRUE(all_close(y, reference_unary(x, [&](double v) { return unary_ref(op, v, 0); })));
    const Tensor t = unary_input(op, {6, 5}, DType::f64).transpose(0, 1);
    EXPECT_TRUE(all_close(kernels::unary(op, t),
                          reference_unary(t, [&](double v) { return unary_ref(op, v, 0); })));
  }
}

// ---- minimum and maximum ----------------------------------------------------------------

TEST(CpuMinMax, match_the_reference_with_broadcasting_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    for (BinaryOp op : {BinaryOp::Min, BinaryOp::Max}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + kernels::op_name(op));
      // A selection is exact: the result is one of the inputs.
      const Tensor a = test::random_normal({3, 1, 5}, dt);
      const Tensor b = test::random_normal({4, 5}, dt);
      const Tensor out = kernels::binary(op, a, b);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(all_equal(out, reference_binary(a, b, {3, 4, 5}, binary_fn(op))));
      // A scalar operand, both orders.
      EXPECT_TRUE(all_equal(kernels::binary_scalar(op, b, 0.25, true),
                            reference_unary(b, [&](double x) { return binary_fn(op)(0.25, x); })));
      // A transposed (strided) operand and a channels-last one, which the result keeps.
      const Tensor t = test::random_normal({5, 4}, dt).transpose(0, 1);
      EXPECT_TRUE(
          all_equal(kernels::binary(op, t, b), reference_binary(t, b, {4, 5}, binary_fn(op))));
      const Tensor cl = test::as_channels_last(test::random_normal({2, 3, 4, 5}, dt));
      const Tensor cl_out = kernels::binary(op, cl, b);
      EXPECT_TRUE(cl_out.is_channels_last());
      EXPECT_TRUE(all_equal(cl_out, reference_binary(cl, b, {2, 3, 4, 5}, binary_fn(op))));
    }
  }
}

TEST(CpuMinMax, nan_in_either_operand_propagates) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = from_vector<double>({NAN, 1.0, 2.0, NAN, -1.0}, {5}).to(dt);
    const Tensor b = from_vector<double>({1.0, NAN, 3.0, NAN, -1.0}, {5}).to(dt);
    const std::vector<double> mn = values(kernels::binary(BinaryOp::Min, a, b));
    const std::vector<double> mx = values(kernels::binary(BinaryOp::Max, a, b));
    for (int i : {0, 1, 3}) {
      EXPECT_TRUE(std::isnan(mn[i])) << i;
      EXPECT_TRUE(std::isnan(mx[i])) << i;
    }
    EXPECT_EQ(mn[2], 2.0);
    EXPECT_EQ(mx[2], 3.0);
    EXPECT_EQ(mn[4], -1.0);
    EXPECT_EQ(mx[4], -1.0);
  }
}

// The gradient for x: all of grad where x wins, none where it loses, half at
// ties (PyTorch's split), all of it at a NaN; written from the rule here.
double minmax_grad_ref(BinaryOp op, double g, double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return g;
  if (x == y) return g / 2;
  const bool wins = op == BinaryOp::Max ? x > y : x < y;
  return wins ? g : 0.0;
}

TEST(CpuMinMax, backward_routes_to_the_winner_and_splits_ties) {
  for (DType dt : kFloatTypes) {
    for (BinaryOp op : {BinaryOp::Min, BinaryOp::Max}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + kernels::op_name(op));
      // Few distinct values make ties frequent; g / 2 is exact.
      const Tensor a = test::random_integers({4, 6}, -2, 2, dt);
      const Tensor b = test::random_integers({6}, -2, 2, dt);
      const Tensor g = test::random_integers({4, 6}, -9, 9, dt);
      const Tensor da = kernels::minmax_backward(op, g, a, b);
      const Tensor db = kernels::minmax_backward(op, g, b, a);
      EXPECT_EQ(da.shape(), (Shape{4, 6}));
      const std::vector<double> vg = values(g), vb = values(b), va = values(a);
      std::vector<double> ra(24), rb(24);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 6; ++j) {
          ra[i * 6 + j] = minmax_grad_ref(op, vg[i * 6 + j], va[i * 6 + j], vb[j]);
          rb[i * 6 + j] = minmax_grad_ref(op, vg[i * 6 + j], vb[j], va[i * 6 + j]);
        }
      EXPECT_TRUE(all_equal(da, f64_tensor(ra, {4, 6})));
      EXPECT_TRUE(all_equal(db, f64_tensor(rb, {4, 6})));
    }
  }
  // A NaN passes the whole gradient to both operands (PyTorch's formula).
  const Tensor x = from_vector<double>({NAN}, {1}), y = from_vector<double>({1.0}, {1});
  const Tensor g = from_vector<double>({2.0}, {1});
  EXPECT_EQ(kernels::minmax_backward(BinaryOp::Max, g, x, y).item(), 2.0);
  EXPECT_EQ(kernels::minmax_backward(BinaryOp::Max, g, y, x).item(), 2.0);
}

TEST(CpuMinMax, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::binary(BinaryOp::Max, zeros({2, 3}), zeros({4})), "maximum", "[2, 3]",
               "[4]", "cannot be broadcast");
  EXPECT_ERROR(kernels::binary(BinaryOp::Min, zeros({2}, DType::f64), zeros({2})), "minimum",
               "dtypes f64 and f32 differ", "convert b with b.to(DType::f64)");
  EXPECT_ERROR(kernels::binary(BinaryOp::Min, zeros({2}, DType::i64), zeros({2}, DType::i64)),
               "minimum", "i64", "floating");
  EXPECT_ERROR(kernels::binary(BinaryOp::Max, Tensor(), zeros({2})), "maximum", "a", "undefined");
  EXPECT_ERROR(kernels::minmax_backward(BinaryOp::Add, zeros({2}), zeros({2}), zeros({2})),
               "minmax_backward", "add");
  EXPECT_ERROR(kernels::minmax_backward(BinaryOp::Max, zeros({3}), zeros({2}), zeros({2})),
               "maximum_backward", "[3]", "[2]");
  EXPECT_ERROR(
      kernels::minmax_backward(BinaryOp::Min, zeros({2}), zeros({2}), zeros({2}, DType::bf16)),
      "minimum_backward", "dtypes f32 and bf16 differ");
}

// ---- clamp ---------------------------------------------------------------------------------

TEST(CpuClamp, matches_the_reference_with_both_or_one_bound_in_every_dtype) {
  using Bounds = std::pair<std::optional<double>, std::optional<double>>;
  const Bounds cases[] = {{-1.0, 0.5}, {std::nullopt, 0.25}, {-0.75, std::nullopt}, {0.375, 0.375}};
  for (DType dt : kFloatTypes) {
    const Tensor x = test::random_normal({5, 7}, dt, Device::cpu(), 2.0);
    for (const auto& [lo, hi] : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " [" + (lo ? std::to_string(*lo) : "none") + ", " +
                   (hi ? std::to_string(*hi) : "none") + "]");
      const Tensor out = kernels::clamp(x, lo, hi);
      EXPECT_EQ(out.dtype(), dt);
      // The bounds are exact in every dtype, so the result is one of the inputs or a bound.
      EXPECT_TRUE(all_equal(out, reference_unary(x, [&](double v) {
                              if (lo && v < *lo) return *lo;
                              if (hi && v > *hi) return *hi;
                              return v;
                            })));
      const Tensor g = test::random_normal({5, 7}, dt);
      const std::vector<double> vx = values(x), vg = values(g);
      std::vector<double> r(vx.size());
      for (size_t i = 0; i < vx.size(); ++i)
        r[i] = (!lo || vx[i] >= *lo) && (!hi || vx[i] <= *hi) ? vg[i] : 0.0;
      EXPECT_TRUE(all_equal(kernels::clamp_backward(g, x, lo, hi), f64_tensor(r, {5, 7})));
    }
  }
}

TEST(CpuClamp, nan_stays_nan_and_the_gradient_passes_at_the_bounds) {
  const Tensor x = from_vector<double>({-2.0, -1.0, 0.0, 1.0, 2.0, NAN}, {6});
  const std::vector<double> out = values(kernels::clamp(x, -1.0, 1.0));
  EXPECT_EQ(std::vector<double>(out.begin(), out.begin() + 5),
            (std::vector<double>{-1, -1, 0, 1, 1}));
  EXPECT_TRUE(std::isnan(out[5]));
  // PyTorch's convention: gradient 1 at equality with a bound, 0 at NaN.
  EXPECT_EQ(values(kernels::clamp_backward(ones({6}, DType::f64), x, -1.0, 1.0)),
            (std::vector<double>{0, 1, 1, 1, 0, 0}));
}

TEST(CpuClamp, strided_and_channels_last_inputs) {
  const Tensor t = test::random_normal({6, 5}, DType::f32).transpose(0, 1);
  EXPECT_TRUE(all_equal(kernels::clamp(t, -0.5, 0.5), reference_unary(t, [](double v) {
                          return std::min(std::max(v, -0.5), 0.5);
                        })));
  const Tensor cl = test::as_channels_last(test::random_normal({2, 3, 4, 5}, DType::f32));
  const Tensor out = kernels::clamp(cl, std::nullopt, 0.0);
  EXPECT_TRUE(out.is_channels_last());
  EXPECT_TRUE(all_equal(out, reference_unary(cl, [](double v) { return std::min(v, 0.0); })));
  EXPECT_EQ(kernels::clamp(zeros({0, 3}), 0.0, 1.0).shape(), (Shape{0, 3}));
}

TEST(CpuClamp, bad_inputs_throw_naming_op_and_values) {
  EXPECT_ERROR(kernels::clamp(zeros({2}), 2.5, 1.5), "clamp", "min 2.5", "max 1.5");
  EXPECT_ERROR(kernels::clamp(zeros({2}), std::nullopt, std::nullopt), "clamp",
               "at least one of min and max");
  EXPECT_ERROR(kernels::clamp(zeros({2}), NAN, 1.0), "clamp", "min is NaN");
  EXPECT_ERROR(kernels::clamp(zeros({2}, DType::i32), 0.0, 1.0), "clamp", "i32", "floating");
  EXPECT_ERROR(kernels::clamp(Tensor(), 0.0, 1.0), "clamp", "undefined");
  EXPECT_ERROR(kernels::clamp_backward(zeros({2}), zeros({3}), 0.0, 1.0), "clamp_backward", "[2]",
               "[3]");
  EXPECT_ERROR(kernels::clamp_backward(zeros({2}), zeros({2}, DType::f64), 0.0, 1.0),
               "clamp_backward", "dtypes f32 and f64 differ");
  EXPECT_ERROR(kernels::clamp_backward(zeros({2}), zeros({2}), 3.0, -3.0), "clamp_backward",
               "min 3", "max -3");
}

// ---- masked_fill, where with a scalar ----------------------------------------------------

TEST(CpuMaskedFill, fills_where_the_broadcast_mask_is_true_in_every_dtype) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_integers({3, 4, 5}, -9, 9, DType::f64).to(dt);
    const Tensor mask = test::random_integers({4, 1}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor out = kernels::masked_fill(x, mask, -7.0);
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.shape(), x.shape());
    const std::vector<double> vx = values(x), vm = values(mask);
    std::vector<double> r(vx.size());
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k)
          r[(i * 4 + j) * 5 + k] = vm[j] != 0 ? -7.0 : vx[(i * 4 + j) * 5 + k];
    EXPECT_TRUE(all_equal(out, f64_tensor(r, x.shape())));
  }
  // An attention mask: -inf above the diagonal.
  const Tensor scores = test::random_normal({3, 3}, DType::f32);
  const Tensor above =
      kernels::compare(CompareOp::Gt, arange(0, 3).view({1, 3}), arange(0, 3).view({3, 1}));
  const std::vector<double> masked =
      values(kernels::masked_fill(scores, above, -std::numeric_limits<double>::infinity()));
  const std::vector<double> vs = values(scores);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(masked[i * 3 + j],
                j > i ? -std::numeric_limits<double>::infinity() : vs[i * 3 + j]);
}

TEST(CpuMaskedFill, channels_last_and_strided_x) {
  const Tensor x = test::as_channels_last(test::random_normal({2, 3, 4, 5}, DType::f32));
  const Tensor mask = test::random_integers({5}, 0, 1, DType::i64).to(DType::boolean);
  const Tensor out = kernels::masked_fill(x, mask, 0.5);
  EXPECT_TRUE(out.is_channels_last());
  const Tensor expected = kernels::masked_fill(x.contiguous(), mask, 0.5);
  EXPECT_TRUE(all_equal(out, expected));
  const Tensor t = test::random_normal({5, 4}, DType::f64).transpose(0, 1);
  const std::vector<double> vt = values(t), vm = values(mask),
                            vo = values(kernels::masked_fill(t, mask, 2.0));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(vo[i * 5 + j], vm[j] != 0 ? 2.0 : vt[i * 5 + j]);
}

TEST(CpuMaskedFill, bad_inputs_throw_naming_op_and_operands) {
  const Tensor mask = from_vector<int32_t>({1, 0, 1}, {3}, DType::boolean);
  EXPECT_ERROR(kernels::masked_fill(zeros({3}), zeros({3}), 1.0), "masked_fill", "mask", "f32",
               "bool");
  EXPECT_ERROR(kernels::masked_fill(zeros({3}), mask.expand({2, 3}), 1.0), "masked_fill",
               "mask of shape [2, 3]", "x of shape [3]");
  EXPECT_ERROR(kernels::masked_fill(zeros({4}), mask, 1.0), "masked_fill", "[4]", "[3]",
               "cannot be broadcast");
  EXPECT_ERROR(kernels::masked_fill(Tensor(), mask, 1.0), "masked_fill", "x", "undefined");
  EXPECT_ERROR(kernels::masked_fill(zeros({3}), Tensor(), 1.0), "masked_fill", "mask", "undefined");
}

TEST(CpuWhere, scalar_operands_take_the_tensor_dtype) {
  const Tensor cond = test::random_integers({3, 1}, 0, 1, DType::i64).to(DType::boolean);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_integers({4}, -9, 9, DType::f64).to(dt);
    const Tensor left = kernels::where(cond, a, -2.5);
    const Tensor right = kernels::where(cond, 1.5, a);
    EXPECT_EQ(left.dtype(), dt);
    EXPECT_EQ(left.shape(), (Shape{3, 4}));
    const std::vector<double> vc = values(cond), va = values(a), vl = values(left),
                              vr = values(right);
    // -2.5 and 1.5 in an integer dtype truncate as a conversion does.
    const double lo = dt == DType::i64 ? -2.0 : -2.5, hi = dt == DType::i64 ? 1.0 : 1.5;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(vl[i * 4 + j], vc[i] != 0 ? va[j] : lo);
        EXPECT_EQ(vr[i * 4 + j], vc[i] != 0 ? hi : va[j]);
      }
  }
  EXPECT_ERROR(kernels::where(cond, Tensor(), 1.0), "where", "a", "undefined");
  EXPECT_ERROR(kernels::where(cond, 1.0, Tensor()), "where", "b", "undefined");
  EXPECT_ERROR(kernels::where(zeros({3, 1}), zeros({4}), 1.0), "where", "cond", "bool");
  EXPECT_ERROR(kernels::where(cond, zeros({2, 4}), 1.0), "where", "[3, 1]", "[2, 4]");
}

// ---- tril and triu ---------------------------------------------------------------------------

// x's last two dims kept where keep(i, j), else 0, in f64 (x any strides).
Tensor triangle_ref(const Tensor& x, int64_t diagonal, bool upper) {
  std::vector<double> v = values(x);
  const int64_t rows = x.size(-2), cols = x.size(-1);
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i) % cols, r = static_cast<int64_t>(i) / cols % rows;
    if (upper ? c - r < diagonal : c - r > diagonal) v[i] = 0.0;
  }
  return f64_tensor(v, x.shape());
}

TEST(CpuTriangle, tril_and_triu_match_a_reference_for_every_diagonal_and_dtype) {
  for (DType dt :
       {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    const Tensor x = dt == DType::boolean
                         ? test::random_integers({2, 3, 4, 5}, 0, 1, DType::i64).to(dt)
                         : test::random_integers({2, 3, 4, 5}, -9, 9, DType::f64).to(dt);
    for (int64_t diagonal : {-5, -1, 0, 2, 7}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " diagonal " + std::to_string(diagonal));
      const Tensor lower = kernels::tril(x, diagonal), upper = kernels::triu(x, diagonal);
      EXPECT_EQ(lower.dtype(), dt);
      EXPECT_TRUE(all_equal(lower, triangle_ref(x, diagonal, false)));
      EXPECT_TRUE(all_equal(upper, triangle_ref(x, diagonal, true)));
    }
  }
}

TEST(CpuTriangle, strided_channels_last_and_empty_inputs) {
  const Tensor t = test::random_normal({6, 4}, DType::f32).transpose(0, 1);  // [4, 6]
  EXPECT_TRUE(all_equal(kernels::tril(t, 1), triangle_ref(t, 1, false)));
  EXPECT_TRUE(all_equal(kernels::triu(t, -2), triangle_ref(t, -2, true)));
  const Tensor cl = test::as_channels_last(test::random_normal({2, 3, 4, 5}, DType::f32));
  EXPECT_TRUE(all_equal(kernels::triu(cl), triangle_ref(cl, 0, true)));
  const Tensor e = test::random_normal({3, 1}, DType::f64).expand({3, 4});
  EXPECT_TRUE(all_equal(kernels::tril(e), triangle_ref(e, 0, false)));
  EXPECT_EQ(kernels::tril(zeros({0, 3})).shape(), (Shape{0, 3}));
}

TEST(CpuTriangle, bad_inputs_throw_naming_op_and_shape) {
  EXPECT_ERROR(kernels::tril(zeros({3})), "tril", "[3]", "fewer than 2 dims");
  EXPECT_ERROR(kernels::triu(scalar_tensor(1.0)), "triu", "[]", "fewer than 2 dims");
  EXPECT_ERROR(kernels::triu(Tensor()), "triu", "undefined");
}

// ---- Note [Broadcasting and dtypes] -----------------------------------------------------------

TEST(CpuBroadcastingAndDtypes, mixed_dtypes_say_which_operand_to_convert_and_how) {
  EXPECT_ERROR(kernels::binary(BinaryOp::Mul, zeros({2, 3}, DType::f64), zeros({3})),
               "mul: dtypes f64 and f32 differ", "a of shape [2, 3]", "b of shape [3]",
               "never promotes", "convert b with b.to(DType::f64)", "to_dtype(b, DType::f64)",
               "or a with a.to(DType::f32)");
  EXPECT_ERROR(kernels::where(from_vector<int32_t>({1}, {1}, DType::boolean), zeros({2}),
                              zeros({2}, DType::bf16)),
               "where: dtypes f32 and bf16 differ", "convert b with b.to(DType::f32)");
  EXPECT_ERROR(kernels::compare(CompareOp::Lt, zeros({2}, DType::i64), zeros({2})),
               "compare: dtypes i64 and f32 differ", "convert b with b.to(DType::i64)");
  // Shapes that do not broadcast name both.
  EXPECT_ERROR(kernels::binary(BinaryOp::Add, zeros({2, 3}), zeros({2})), "add", "[2, 3]", "[2]",
               "cannot be broadcast together");
}

// ---- axpy_ ----------------------------------------------------------------------------------

TEST(CpuAxpy, adds_into_a_strided_view_and_leaves_the_rest) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor base = test::random_integers({4, 6}, -5, 5, dt);
    const std::vector<double> before = values(base);
    Tensor dst = base.narrow(1, 1, 3).transpose(0, 1);   // [3, 4], strides [1, 6]
    Tensor src = test::random_integers({4}, -5, 5, dt);  // broadcast over dst's rows
    kernels::axpy_(dst, -2.0, src);
    const std::vector<double> after = values(base), vs = values(src);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) {
        const bool inside = j >= 1 && j < 4;
        EXPECT_EQ(after[i * 6 + j], before[i * 6 + j] + (inside ? -2.0 * vs[i] : 0.0));
      }
  }
}

// Note [Mixed axpy]: a src of any floating dtype adds exactly what
// src.to(dst.dtype()) would, bit for bit (a 16-bit src into f32 in one pass),
// into strided destinations too.
TEST(CpuAxpy, a_src_of_another_dtype_adds_as_its_conversion_would) {
  for (DType dst_dtype : kFloatTypes) {
    for (DType src_dtype : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(src_dtype)) + " into " + dtype_name(dst_dtype));
      const Tensor base = test::random_normal({5, 9}, dst_dtype);
      const Tensor src = test::random_normal({9, 3}, src_dtype).transpose(0, 1);  // [3, 9]
      Tensor mixed = base.clone(), converted = base.clone();
      kernels::axpy_(mixed.narrow(0, 1, 3), -0.75, src);
      kernels::axpy_(converted.narrow(0, 1, 3), -0.75, src.to(dst_dtype));
      EXPECT_TRUE(test::all_equal(mixed, converted));
    }
  }
}

TEST(CpuAxpy, zero_dim_and_empty) {
  Tensor s = scalar_tensor(1.0, DType::f64);
  kernels::axpy_(s, 0.5, scalar_tensor(4.0, DType::f64));
  EXPECT_EQ(s.item(), 3.0);
  Tensor e = zeros({0, 3});
  kernels::axpy_(e, 1.0, ones({3}));
  EXPECT_EQ(e.numel(), 0);
}

TEST(CpuAxpy, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::axpy_(zeros({3}), 1.0, zeros({2, 3})), "axpy_", "[2, 3]", "[3]");
  EXPECT_ERROR(kernels::axpy_(zeros({3}), 1.0, zeros({3}, DType::i32)), "axpy_", "src", "i32");
  EXPECT_ERROR(kernels::axpy_(zeros({1}).expand({3}), 1.0, zeros({3})), "axpy_", "[3]", "overlaps");
  EXPECT_ERROR(kernels::axpy_(zeros({3}, DType::i32), 1.0, zeros({3}, DType::i32)), "axpy_", "i32");
}

}  // namespace
}  // namespace accrue
