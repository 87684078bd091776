// The CPU elementwise kernels (binary, scalar, unary and their gradients,
// compare, where, axpy_) through kernels/ops.h, each against an independent
// f64 loop written here or against hand-computed values.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>
#include <limits>

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
  }
  return 0;
}

const UnaryOp kUnaryOps[] = {UnaryOp::Neg,  UnaryOp::Exp,     UnaryOp::Log,
                             UnaryOp::Sqrt, UnaryOp::Tanh,    UnaryOp::Relu,
                             UnaryOp::Gelu, UnaryOp::Sigmoid, UnaryOp::Pow};

// Inputs in each op's domain: positive for log, sqrt and a fractional pow.
Tensor unary_input(UnaryOp op, const Shape& shape, DType dtype) {
  if (op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Pow)
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
