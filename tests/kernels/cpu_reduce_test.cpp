// The CPU reductions (sum, mean, max, argmax, sum_to, sum_rows_into) and
// softmax / log_softmax through kernels/ops.h, each against an independent f64
// loop written here or hand-computed values.
#include <gmock/gmock.h>

#include <cmath>
#include <limits>

#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::ReduceOp;
using test::all_close;
using test::all_equal;
using ::testing::HasSubstr;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

Tensor f64_tensor(const std::vector<double>& v, const Shape& shape) {
  return from_vector<double>(v, shape, DType::f64);
}

// The f64 reduction of `a` over `dims` (empty: all), visiting the input in
// row-major order, so an output's k-th visit is the k-th element of its
// reduced sub-block (which is what argmax counts).
Tensor reference_reduce(const Tensor& a, std::vector<int64_t> dims, bool keepdim, ReduceOp op) {
  const Shape& in = a.shape();
  const int64_t rank = a.dim();
  std::vector<bool> reduced(rank, dims.empty());
  for (int64_t d : dims)
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;
  Shape full = in, out_shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) full[d] = 1;
    if (!reduced[d] || keepdim) out_shape.push_back(full[d]);
  }
  const int64_t n_out = shape_numel(full);
  std::vector<double> acc(n_out, op == ReduceOp::Sum || op == ReduceOp::Mean ? 0.0 : -INFINITY);
  std::vector<double> arg(n_out, 0.0), seen(n_out, 0.0);
  const std::vector<double> v = values(a);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t rem = i, o = 0, stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      const int64_t idx = rem % in[d];
      rem /= in[d];
      if (!reduced[d]) o += idx * stride;
      stride *= full[d];
    }
    const double x = v[i];
    if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
      acc[o] += x;
    } else if (!std::isnan(acc[o]) && (std::isnan(x) || x > acc[o])) {
      acc[o] = x;
      arg[o] = seen[o];
    }
    seen[o] += 1;
  }
  if (op == ReduceOp::Mean)
    for (int64_t o = 0; o < n_out; ++o)
      acc[o] /= seen[o];
  return f64_tensor(op == ReduceOp::ArgMax ? arg : acc, out_shape);
}

Tensor run_reduce(ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  switch (op) {
    case ReduceOp::Sum:
      return kernels::sum(a, dims, keepdim);
    case ReduceOp::Mean:
      return kernels::mean(a, dims, keepdim);
    case ReduceOp::Max:
      return kernels::max(a, dims, keepdim);
    case ReduceOp::ArgMax:
      return kernels::argmax(a, dims.at(0), keepdim);
  }
  return Tensor();
}

// ---- sum, mean, max, argmax -------------------------------------------------------------

TEST(CpuReduce, single_multiple_negative_dims_with_and_without_keepdim) {
  const std::vector<std::vector<int64_t>> dim_sets = {{},     {0},    {1},      {-1},
                                                      {0, 2}, {2, 0}, {-3, -2}, {0, 1, 2}};
  for (DType dt : kFloatTypes) {
    Tensor a = test::random_normal({3, 4, 5}, dt);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      for (const auto& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " op " << static_cast<int>(op) << " dims "
                       << shape_str(dims) << " keepdim " << keepdim);
          Tensor out = run_reduce(op, a, dims, keepdim);
          EXPECT_EQ(out.dtype(), dt);
          EXPECT_TRUE(all_close(out, reference_reduce(a, dims, keepdim, op)));
        }
      }
    }
  }
}

TEST(CpuReduce, integer_sums_are_exact_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = test::random_integers({4, 5, 6}, -4, 4, dt);
    EXPECT_TRUE(
        all_equal(kernels::sum(a, {0, 2}), reference_reduce(a, {0, 2}, false, ReduceOp::Sum)));
    EXPECT_TRUE(
        all_equal(kernels::sum(a, {-1}, true), reference_reduce(a, {-1}, true, ReduceOp::Sum)));
    EXPECT_TRUE(all_equal(kernels::max(a, {1}), reference_reduce(a, {1}, false, ReduceOp::Max)));
  }
}

TEST(CpuReduce, hand_computed_values) {
  Tensor a = from_vector<float>({1, 5, 3, 5, -2, 0}, {2, 3});
  EXPECT_EQ(kernels::sum(a).item(), 12.0);
  EXPECT_EQ(kernels::sum(a, {0}).to_vector<float>(), (std::vector<float>{6, 3, 3}));
  EXPECT_EQ(kernels::mean(a, {1}).to_vector<float>(), (std::vector<float>{3, 1}));
  EXPECT_EQ(kernels::max(a, {1}).to_vector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(kernels::max(a).item(), 5.0);
  // argmax: the first maximum, along a dim and over the flattened tensor.
  Tensor am = kernels::argmax(a, 1);
  EXPECT_EQ(am.dtype(), DType::i64);
  EXPECT_EQ(am.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(kernels::argmax(a, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  Tensor flat = kernels::argmax(a);
  EXPECT_EQ(flat.dim(), 0);
  EXPECT_EQ(flat.item(), 1.0);
  EXPECT_EQ(kernels::argmax(a, -1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(kernels::argmax(a, std::nullopt, true).shape(), (Shape{1, 1}));
}

TEST(CpuReduce, argmax_matches_reference_on_strided_inputs) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // Small integers: many ties, so "first maximum" is exercised.
    Tensor a = test::random_integers({5, 4, 3}, -2, 2, dt).permute({2, 0, 1});  // [3, 5, 4]
    for (int64_t d : {0, 1, 2, -1})
      for (bool keepdim : {false, true})
        EXPECT_TRUE(all_equal(kernels::argmax(a, d, keepdim),
                              reference_reduce(a, {d}, keepdim, ReduceOp::ArgMax)));
  }
}

TEST(CpuReduce, max_and_argmax_propagate_nan) {
  Tensor a = from_vector<double>({1, kNaN, 3, kNaN, 2, 4, 9, 8}, {2, 4});
  EXPECT_TRUE(std::isnan(kernels::max(a).item()));
  std::vector<double> m = kernels::max(a, {1}).to_vector<double>();
  EXPECT_TRUE(std::isnan(m[0]));
  EXPECT_EQ(m[1], 9.0);
  // The first NaN is the argmax.
  EXPECT_EQ(kernels::argmax(a, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(kernels::argmax(a).item(), 1.0);
  EXPECT_TRUE(std::isnan(kernels::sum(a).item()));
}

TEST(CpuReduce, non_contiguous_inputs) {
  Tensor t = test::random_normal({6, 5}, DType::f32).transpose(0, 1);  // [5, 6]
  Tensor n = test::random_normal({4, 9}, DType::f64).narrow(1, 3, 5);  // row stride 9
  Tensor e = test::random_normal({3, 1}, DType::f32).expand({3, 7});   // stride 0
  for (const Tensor& x : {t, n, e}) {
    EXPECT_TRUE(all_close(kernels::sum(x, {0}), reference_reduce(x, {0}, false, ReduceOp::Sum)));
    EXPECT_TRUE(
        all_close(kernels::mean(x, {1}, true), reference_reduce(x, {1}, true, ReduceOp::Mean)));
    EXPECT_TRUE(all_close(kernels::max(x), reference_reduce(x, {}, false, ReduceOp::Max)));
  }
}

TEST(CpuReduce, zero_dim_inputs_reduce_to_themselves) {
  Tensor s = scalar_tensor(2.5);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{}, {0}, {-1}}) {
    Tensor r = kernels::sum(s, dims);
    EXPECT_EQ(r.dim(), 0);
    EXPECT_EQ(r.item(), 2.5);
    EXPECT_EQ(kernels::mean(s, dims, true).item(), 2.5);
    EXPECT_EQ(kernels::max(s, dims).item(), 2.5);
  }
  EXPECT_EQ(kernels::argmax(s).item(), 0.0);
  EXPECT_EQ(kernels::argmax(s, 0).item(), 0.0);
}

TEST(CpuReduce, empty_inputs_sum_to_zero_mean_nan_and_max_throws) {
  EXPECT_EQ(kernels::sum(zeros({0})).item(), 0.0);
  EXPECT_EQ(kernels::sum(zeros({2, 0}), {1}).to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_EQ(kernels::sum(zeros({0, 3}), {1}).shape(), (Shape{0}));
  EXPECT_EQ(kernels::sum(zeros({0, 3}), {0}, true).to_vector<float>(),
            (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(kernels::mean(zeros({0}, DType::f64)).item()));
  EXPECT_EQ(kernels::max(zeros({0, 3}), {1}).shape(), (Shape{0}));  // nothing to reduce over
  EXPECT_ERROR(kernels::max(zeros({0, 3})), "max", "empty", "[0, 3]");
  EXPECT_ERROR(kernels::max(zeros({2, 0}), {1}), "max", "[2, 0]");
  EXPECT_ERROR(kernels::argmax(zeros({0})), "argmax", "[0]");
}

TEST(CpuReduce, bad_inputs_throw_naming_op_and_operands) {
  EXPECT_ERROR(kernels::sum(zeros({2, 3}), {2}), "sum", "dim 2", "[2, 3]");
  EXPECT_ERROR(kernels::mean(zeros({2, 3}), {-3}), "mean", "dim -3", "[2, 3]");
  EXPECT_ERROR(kernels::sum(zeros({2, 3}), {1, -1}), "sum", "more than once", "[2, 3]");
  EXPECT_ERROR(kernels::max(zeros({2, 3}, DType::i64)), "max", "i64", "[2, 3]");
  EXPECT_ERROR(kernels::argmax(zeros({2, 3}), 5), "argmax", "dim 5", "[2, 3]");
  EXPECT_ERROR(kernels::sum(Tensor()), "sum", "undefined");
}

// ---- sum_to -------------------------------------------------------------------------------

TEST(CpuSumTo, reduces_leading_and_size_one_dims) {
  Tensor a = test::random_integers({2, 3, 4}, -5, 5, DType::f32);
  EXPECT_TRUE(all_equal(kernels::sum_to(a, {3, 1}),
                        reference_reduce(a, {0, 2}, true, ReduceOp::Sum).reshape({3, 1})));
  EXPECT_TRUE(all_equal(kernels::sum_to(a, {1, 4}),
                        reference_reduce(a, {0, 1}, false, ReduceOp::Sum).reshape({1, 4})));
  EXPECT_TRUE(
      all_equal(kernels::sum_to(a, {4}), reference_reduce(a, {0, 1}, false, ReduceOp::Sum)));
  EXPECT_TRUE(
      all_equal(kernels::sum_to(a, {2, 1, 1}), reference_reduce(a, {1, 2}, true, ReduceOp::Sum)));
  Tensor all = kernels::sum_to(a, {});
  EXPECT_EQ(all.dim(), 0);
  EXPECT_EQ(all.item(), values(kernels::sum(a))[0]);
  // Nothing broadcast: the input itself.
  EXPECT_TRUE(kernels::sum_to(a, {2, 3, 4}).is_same(a));
  // Size-1 dims kept as they are, and an empty broadcast extent sums to 0.
  Tensor b = test::random_normal({3, 1}, DType::f64);
  EXPECT_TRUE(all_close(kernels::sum_to(b, {1}), kernels::sum(b, {0})));
  EXPECT_EQ(kernels::sum_to(zeros({0, 2}), {1, 2}).to_vector<float>(), (std::vector<float>{0, 0}));
}

TEST(CpuSumTo, bad_shapes_throw) {
  EXPECT_ERROR(kernels::sum_to(zeros({2, 3}), {4}), "sum_to", "[4]", "[2, 3]");
  EXPECT_ERROR(kernels::sum_to(zeros({3}), {2, 3}), "sum_to", "[2, 3]", "[3]");
}

// ---- sum_rows_into ------------------------------------------------------------------------

TEST(CpuSumRows, writes_then_accumulates) {
  for (DType dt : kFloatTypes) {
    for (DType out_dt : {dt, DType::f32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " into " + dtype_name(out_dt));
      Tensor a = test::random_integers({7, 5}, -6, 6, dt);
      Tensor out = empty({5}, out_dt);
      test::poison(out);  // written, not read, when !accumulate
      kernels::sum_rows_into(a, out, false);
      Tensor expected = reference_reduce(a, {0}, false, ReduceOp::Sum);
      EXPECT_TRUE(all_equal(out, expected));
      Tensor b = test::random_integers({3, 5}, -6, 6, dt);
      kernels::sum_rows_into(b, out, true);
      EXPECT_TRUE(all_equal(out, kernels::binary(kernels::BinaryOp::Add, expected,
                                                 reference_reduce(b, {0}, false, ReduceOp::Sum))));
    }
  }
  // A transposed input, and no rows at all.
  Tensor t = test::random_normal({4, 3}, DType::f64).transpose(0, 1);  // [3, 4]
  Tensor out = empty({4}, DType::f64);
  kernels::sum_rows_into(t, out, false);
  EXPECT_TRUE(all_close(out, reference_reduce(t, {0}, false, ReduceOp::Sum)));
  kernels::sum_rows_into(zeros({0, 4}, DType::f64), out, true);
  EXPECT_TRUE(all_close(out, reference_reduce(t, {0}, false, ReduceOp::Sum)));
  kernels::sum_rows_into(zeros({0, 4}, DType::f64), out, false);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{0, 0, 0, 0}));
}

TEST(CpuSumRows, bad_inputs_throw) {
  EXPECT_ERROR(kernels::sum_rows_into(zeros({2, 3}), zeros({4}), false), "sum_rows_into", "[2, 3]",
               "[4]");
  EXPECT_ERROR(kernels::sum_rows_into(zeros({2, 3, 1}), zeros({3}), false), "sum_rows_into",
               "[2, 3, 1]");
  EXPECT_ERROR(kernels::sum_rows_into(zeros({2, 3}), zeros({3}, DType::bf16), false),
               "sum_rows_into", "bf16");
  EXPECT_ERROR(kernels::sum_rows_into(zeros({2, 3}), zeros({3, 2}).select(1, 0), false),
               "sum_rows_into", "contiguous");
}

// ---- softmax ------------------------------------------------------------------------------

// softmax or log_softmax of `a` along dim, in f64.
Tensor reference_softmax(const Tensor& a, int64_t dim, bool log) {
  const int64_t rank = a.dim();
  dim = dim < 0 ? dim + rank : dim;
  const Shape& s = a.shape();
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < rank; ++d)
    inner *= s[d];
  const int64_t n = s[dim], outer = a.numel() / (n * inner);
  std::vector<double> v = values(a), r(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return (o * n + k) * inner + i; };
      double m = -INFINITY, z = 0;
      for (int64_t k = 0; k < n; ++k)
        m = std::max(m, v[at(k)]);
      for (int64_t k = 0; k < n; ++k)
        z += std::exp(v[at(k)] - m);
      for (int64_t k = 0; k < n; ++k)
        r[at(k)] = log ? v[at(k)] - m - std::log(z) : std::exp(v[at(k)] - m) / z;
    }
  return f64_tensor(r, s);
}

TEST(CpuSoftmax, matches_reference_along_every_dim_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    Tensor a = test::random_normal({3, 4, 5}, dt, Device::cpu(), 3.0);
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " dim " << dim << " log " << log);
        Tensor out = log ? kernels::log_softmax(a, dim) : kernels::softmax(a, dim);
        EXPECT_EQ(out.shape(), a.shape());
        EXPECT_TRUE(out.is_contiguous());
        EXPECT_TRUE(all_close(out, reference_softmax(a, dim, log)));
      }
    }
  }
}

TEST(CpuSoftmax, rows_sum_to_one_and_large_inputs_are_stable) {
  Tensor a = test::random_normal({4, 6}, DType::f32, Device::cpu(), 2.0);
  Tensor row_sums = kernels::sum(kernels::softmax(a, 1).to(DType::f64), {1});
  EXPECT_TRUE(all_close(row_sums, ones({4}, DType::f64), 1e-6, 1e-6));
  // exp(1000) overflows; the max-shifted form must not.
  Tensor big = from_vector<float>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3});
  Tensor p = kernels::softmax(big, -1);
  Tensor lp = kernels::log_softmax(big, -1);
  const double e0 = 1.0 / (1.0 + std::exp(1.0) + std::exp(2.0));
  EXPECT_TRUE(all_close(p, f64_tensor({e0, e0 * std::exp(1.0), e0 * std::exp(2.0),
                                       e0 * std::exp(2.0), e0 * std::exp(1.0), e0},
                                      {2, 3})));
  EXPECT_TRUE(all_close(lp, reference_softmax(big, 1, true)));
  EXPECT_NEAR(values(lp)[2], std::log(e0 * std::exp(2.0)), 1e-5);
}

TEST(CpuSoftmax, strided_zero_dim_and_empty_inputs) {
  Tensor t = test::random_normal({5, 3}, DType::f64).transpose(0, 1);
  EXPECT_TRUE(all_close(kernels::softmax(t, 1), reference_softmax(t, 1, false)));
  EXPECT_TRUE(all_close(kernels::log_softmax(t, 0), reference_softmax(t, 0, true)));
  Tensor s = kernels::softmax(scalar_tensor(3.0), 0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 1.0);
  EXPECT_EQ(kernels::log_softmax(scalar_tensor(3.0), -1).item(), 0.0);
  EXPECT_EQ(kernels::softmax(zeros({0, 3}), 1).shape(), (Shape{0, 3}));
  EXPECT_EQ(kernels::log_softmax(zeros({2, 0}), 1).shape(), (Shape{2, 0}));
}

// dx = y * (dy - sum(dy * y)) and dx = dy - exp(y) * sum(dy), checked against
// central differences of the f64 reference forward.
TEST(CpuSoftmax, backward_matches_finite_differences) {
  for (bool log : {false, true}) {
    for (int64_t dim : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "log " << log << " dim " << dim);
      Tensor x = test::random_normal({3, 4}, DType::f64);
      Tensor dy = test::random_normal({3, 4}, DType::f64);
      Tensor y = log ? kernels::log_softmax(x, dim) : kernels::softmax(x, dim);
      Tensor dx =
          log ? kernels::log_softmax_backward(dy, y, dim) : kernels::softmax_backward(dy, y, dim);
      std::vector<double> vx = values(x), vdy = values(dy), fd(vx.size());
      const double h = 1e-6;
      for (size_t i = 0; i < vx.size(); ++i) {
        auto loss = [&](double delta) {
          std::vector<double> xp = vx;
          xp[i] += delta;
          std::vector<double> yp = values(reference_softmax(f64_tensor(xp, {3, 4}), dim, log));
          double l = 0;
          for (size_t j = 0; j < yp.size(); ++j)
            l += vdy[j] * yp[j];
          return l;
        };
        fd[i] = (loss(h) - loss(-h)) / (2 * h);
      }
      EXPECT_TRUE(all_close(dx, f64_tensor(fd, {3, 4}), 1e-6, 1e-8));
    }
  }
}

TEST(CpuSoftmax, backward_in_every_dtype_matches_formula) {
  for (DType dt : kFloatTypes) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " log " << log);
      Tensor x = test::random_normal({5, 3}, dt).transpose(0, 1);  // [3, 5] strided
      Tensor dy = test::random_normal({3, 5}, dt);
      Tensor y = log ? kernels::log_softmax(x, 0) : kernels::softmax(x, 0);
      Tensor dx =
          log ? kernels::log_softmax_backward(dy, y, 0) : kernels::softmax_backward(dy, y, 0);
      // The formula in f64 along dim 0 on the stored (rounded) y.
      std::vector<double> vy = values(y), vdy = values(dy), r(vy.size());
      for (int j = 0; j < 5; ++j) {
        double s = 0;
        for (int i = 0; i < 3; ++i)
          s += log ? vdy[i * 5 + j] : vdy[i * 5 + j] * vy[i * 5 + j];
        for (int i = 0; i < 3; ++i) {
          const int k = i * 5 + j;
          r[k] = log ? vdy[k] - std::exp(vy[k]) * s : vy[k] * (vdy[k] - s);
        }
      }
      EXPECT_TRUE(all_close(dx, f64_tensor(r, {3, 5})));
    }
  }
}

TEST(CpuSoftmax, bad_inputs_throw) {
  EXPECT_ERROR(kernels::softmax(zeros({2, 3}), 2), "softmax", "dim 2", "[2, 3]");
  EXPECT_ERROR(kernels::log_softmax(zeros({2, 3}, DType::i32), 1), "log_softmax", "i32");
  EXPECT_ERROR(kernels::softmax_backward(zeros({2, 3}), zeros({3, 2}), 1), "softmax_backward",
               "[2, 3]", "[3, 2]");
  EXPECT_ERROR(kernels::log_softmax_backward(zeros({2, 3}), zeros({2, 3}, DType::f64), 1),
               "log_softmax_backward", "dtypes f32 and f64 differ");
}

}  // namespace
}  // namespace accrue
