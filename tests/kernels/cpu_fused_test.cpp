// The CPU reference of the transformer kernels: dropout (kernels/dropout.h),
// linear + bias (+ GELU) and the residual add fused with LayerNorm
// (kernels/fused.h), against plain computations written here and the unfused
// kernels they replace.
#include <gmock/gmock.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/core/random.h"
#include "accrue/kernels/dropout.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::all_close;
using test::all_equal;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// ---- dropout -----------------------------------------------------------------------------

// Note [Dropout mask from the counter], computed independently: element i is
// kept when the f32 uniform accrue::rand draws for it at generator state
// (seed, offset) is >= p, and is then x * (1 - p)^-1 in the math type.
Tensor expected_dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  Generator gen;
  gen.set_state(seed, offset);
  const std::vector<double> u = values(rand(x.shape(), DType::f32, Device::cpu(), &gen));
  const std::vector<double> scaled =
      values(kernels::binary_scalar(kernels::BinaryOp::Mul, x, 1.0 / (1.0 - p)));
  std::vector<double> out(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    out[i] = u[i] >= p ? scaled[i] : 0.0;
  return from_vector(out, x.shape(), x.dtype());
}

int64_t count_nonzero(const Tensor& t) {
  int64_t n = 0;
  for (double v : values(t))
    n += v != 0.0;
  return n;
}

TEST(CpuDropout, mask_is_the_rand_draw_at_the_generator_state_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    for (double p : {0.1, 0.3, 0.5, 0.9}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " p=" + std::to_string(p));
      // An odd count (the last Philox block serves one element) and an odd offset.
      const Tensor x = test::random_normal({5, 7}, dt);
      EXPECT_TRUE(all_equal(kernels::dropout(x, p, 42, 17), expected_dropout(x, p, 42, 17)));
    }
  }
}

TEST(CpuDropout, same_counter_same_mask_other_counter_other_mask) {
  const Tensor x = test::random_normal({64, 33});
  const Tensor a = kernels::dropout(x, 0.5, 7, 100);
  EXPECT_TRUE(all_equal(kernels::dropout(x, 0.5, 7, 100), a));
  EXPECT_FALSE(all_equal(kernels::dropout(x, 0.5, 7, 101), a));
  EXPECT_FALSE(all_equal(kernels::dropout(x, 0.5, 8, 100), a));
  // The mask is the same for every dtype: it depends on the counter only.
  const Tensor ones64 = ones({64, 33}, DType::f64);
  const Tensor ones16 = ones({64, 33}, DType::bf16);
  const std::vector<double> m64 = values(kernels::dropout(ones64, 0.5, 7, 100));
  const std::vector<double> m16 = values(kernels::dropout(ones16, 0.5, 7, 100));
  for (size_t i = 0; i < m64.size(); ++i)
    ASSERT_EQ(m64[i] != 0.0, m16[i] != 0.0) << "element " << i;
}

TEST(CpuDropout, kept_fraction_is_one_minus_p_and_kept_values_are_scaled) {
  const int64_t n = 1 << 20;
  const Tensor x = ones({n});
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const Tensor y = kernels::dropout(x, p, 1234, 0);
    const double kept = static_cast<double>(count_nonzero(y)) / static_cast<double>(n);
    // The standard deviation of the fraction is sqrt(p (1 - p) / n) < 5e-4.
    EXPECT_NEAR(kept, 1.0 - p, 5e-3);
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    for (double v : values(y))
      ASSERT_TRUE(v == 0.0 || v == static_cast<double>(scale)) << v;
  }
}

TEST(CpuDropout, backward_applies_the_same_mask) {
  const Tensor x = test::random_normal({37, 29});
  const Tensor g = test::random_normal({37, 29});
  const double p = 0.25;
  const Tensor y = kernels::dropout(x, p, 99, 12345);
  const Tensor dx = kernels::dropout_backward(g, p, 99, 12345);
  EXPECT_TRUE(all_equal(dx, expected_dropout(g, p, 99, 12345)));
  const std::vector<double> vy = values(y), vdx = values(dx);
  for (size_t i = 0; i < vy.size(); ++i)
    ASSERT_EQ(vy[i] == 0.0, vdx[i] == 0.0) << "element " << i;
}

TEST(CpuDropout, p_zero_is_identity_and_strided_input_counts_row_major) {
  const Tensor x = test::random_normal({6, 10});
  EXPECT_TRUE(all_equal(kernels::dropout(x, 0.0, 5, 5), x));
  // Element i is the i-th of the view in row-major order, whatever the strides.
  const Tensor xt = x.transpose(0, 1);
  EXPECT_TRUE(
      all_equal(kernels::dropout(xt, 0.4, 5, 9), kernels::dropout(xt.contiguous(), 0.4, 5, 9)));
  EXPECT_TRUE(kernels::dropout(xt, 0.4, 5, 9).is_contiguous());
  const Tensor none = kernels::dropout(empty({0, 3}), 0.5, 1, 1);
  EXPECT_EQ(none.shape(), (Shape{0, 3}));
}

TEST(CpuDropout, bad_inputs_throw_naming_op_and_values) {
  const Tensor x = test::random_normal({4});
  EXPECT_ERROR(kernels::dropout(x, 1.0, 0, 0), "dropout", "p = 1", "[0, 1)");
  EXPECT_ERROR(kernels::dropout(x, -0.5, 0, 0), "dropout", "p = -0.5");
  EXPECT_ERROR(kernels::dropout(x, std::nan(""), 0, 0), "dropout", "nan");
  EXPECT_ERROR(kernels::dropout(ones({3}, DType::i64), 0.5, 0, 0), "dropout", "i64", "[3]");
  EXPECT_ERROR(kernels::dropout(Tensor(), 0.5, 0, 0), "dropout", "undefined");
  EXPECT_ERROR(kernels::dropout_backward(x, 2.0, 0, 0), "dropout_backward", "p = 2");
}

// ---- linear + GELU --------------------------------------------------------------------------

double gelu_f64(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

// x [n, in] @ w^T + b in f64, elementwise.
std::vector<double> plain_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const std::vector<double> vx = values(x), vw = values(w), vb = values(b);
  std::vector<double> y(static_cast<size_t>(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t k = 0; k < in; ++k)
        s += vx[i * in + k] * vw[o * in + k];
      y[i * out + o] = s + vb[o];
    }
  return y;
}

TEST(CpuLinearGelu, f64_matches_a_plain_computation) {
  const Tensor x = test::random_normal({7, 6}, DType::f64);
  const Tensor w = test::random_normal({5, 6}, DType::f64);
  const Tensor b = test::random_normal({5}, DType::f64);
  Tensor pre;
  const Tensor y = kernels::linear_gelu(x, w, b, &pre);
  const std::vector<double> expected_pre = plain_linear(x, w, b);
  std::vector<double> expected_y(expected_pre.size());
  for (size_t i = 0; i < expected_pre.size(); ++i)
    expected_y[i] = gelu_f64(expected_pre[i]);
  EXPECT_EQ(y.shape(), (Shape{7, 5}));
  EXPECT_TRUE(all_close(pre, from_vector(expected_pre, {7, 5}, DType::f64), 1e-13, 1e-13));
  EXPECT_TRUE(all_close(y, from_vector(expected_y, {7, 5}, DType::f64), 1e-13, 1e-13));
  // The unfused composition gives the same.
  const Tensor unfused = kernels::unary(
      kernels::UnaryOp::Gelu,
      kernels::binary(kernels::BinaryOp::Add, kernels::matmul(x, w.transpose(0, 1)), b));
  EXPECT_TRUE(all_close(y, unfused, 1e-13, 1e-13));
}

TEST(CpuLinearGelu, every_dtype_rounds_pre_once_and_applies_unary_gelu_to_it) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({9, 24}, dt);
    const Tensor w = test::random_normal({40, 24}, dt, Device::cpu(), 0.2);
    const Tensor b = test::random_normal({40}, dt);
    Tensor pre;
    const Tensor y = kernels::linear_gelu(x, w, b, &pre);
    EXPECT_EQ(pre.dtype(), dt);
    EXPECT_EQ(y.dtype(), dt);
    // pre is the f64 result rounded once to the dtype (the order of the double
    // sums differs from plain_linear's, far below any dtype's precision).
    if (dt == DType::f64) {
      EXPECT_TRUE(
          all_close(pre, from_vector(plain_linear(x, w, b), {9, 40}, DType::f64), 1e-13, 1e-13));
    } else {
      EXPECT_TRUE(all_equal(pre, from_vector(plain_linear(x, w, b), {9, 40}, DType::f64).to(dt)));
    }
    EXPECT_TRUE(all_equal(y, kernels::unary(kernels::UnaryOp::Gelu, pre)));
  }
}

TEST(CpuLinearGelu, strided_inputs_empty_batch_and_empty_inner_dim) {
  const Tensor x = test::random_normal({8, 5});
  const Tensor w = test::random_normal({8, 3});
  const Tensor b = test::random_normal({3});
  // Transposed views are read as the matrices they show.
  const Tensor xt = x.transpose(0, 1), wt = w.transpose(0, 1);
  EXPECT_TRUE(all_equal(kernels::linear_gelu(xt, wt, b, nullptr),
                        kernels::linear_gelu(xt.contiguous(), wt.contiguous(), b, nullptr)));
  Tensor pre;
  const Tensor none = kernels::linear_gelu(empty({0, 8}), wt.contiguous(), b, &pre);
  EXPECT_EQ(none.shape(), (Shape{0, 3}));
  EXPECT_EQ(pre.shape(), (Shape{0, 3}));
  // in == 0: the product is empty, pre is the bias on every row.
  const Tensor y = kernels::linear_gelu(empty({2, 0}), empty({3, 0}), b, &pre);
  EXPECT_TRUE(all_equal(pre, b.unsqueeze(0).expand({2, 3}).contiguous()));
  EXPECT_TRUE(all_equal(y, kernels::unary(kernels::UnaryOp::Gelu, pre)));
}

TEST(CpuLinearGelu, gelu_backward_is_unary_gelu_backward_and_matches_finite_differences) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor pre = test::random_normal({6, 11}, dt, Device::cpu(), 2.0);
    const Tensor g = test::random_normal({6, 11}, dt);
    EXPECT_TRUE(all_equal(kernels::gelu_backward(g, pre),
                          kernels::unary_backward(kernels::UnaryOp::Gelu, g, pre, Tensor())));
  }
  const Tensor pre = test::random_normal({50}, DType::f64, Device::cpu(), 2.0);
  const Tensor g = test::random_normal({50}, DType::f64);
  const std::vector<double> vp = values(pre), vg = values(g);
  const std::vector<double> d = values(kernels::gelu_backward(g, pre));
  const double h = 1e-6;
  for (size_t i = 0; i < vp.size(); ++i) {
    const double numeric = vg[i] * (gelu_f64(vp[i] + h) - gelu_f64(vp[i] - h)) / (2 * h);
    EXPECT_NEAR(d[i], numeric, 1e-7 * (1.0 + std::abs(numeric))) << "element " << i;
  }
}

TEST(CpuLinearGelu, bad_inputs_throw_naming_op_and_shapes) {
  const Tensor x = test::random_normal({4, 6});
  const Tensor w = test::random_normal({5, 6});
  const Tensor b = test::random_normal({5});
  EXPECT_ERROR(kernels::linear_gelu(x, test::random_normal({5, 7}), b, nullptr), "linear_gelu",
               "[4, 6]", "[5, 7]");
  EXPECT_ERROR(kernels::linear_gelu(x.unsqueeze(0), w, b, nullptr), "linear_gelu", "[1, 4, 6]");
  EXPECT_ERROR(kernels::linear_gelu(x, w, test::random_normal({6}), nullptr), "linear_gelu", "bias",
               "[6]", "[5]");
  EXPECT_ERROR(kernels::linear_gelu(x, w, Tensor(), nullptr), "linear_gelu", "bias", "undefined");
  EXPECT_ERROR(kernels::linear_gelu(x, w.to(DType::bf16), b, nullptr), "linear_gelu", "f32",
               "bf16");
  EXPECT_ERROR(kernels::linear_gelu(x.to(DType::i64), w.to(DType::i64), b.to(DType::i64), nullptr),
               "linear_gelu", "i64");
  EXPECT_ERROR(kernels::gelu_backward(test::random_normal({3}), test::random_normal({4})),
               "gelu_backward", "[3]", "[4]");
  EXPECT_ERROR(
      kernels::gelu_backward(test::random_normal({3}), test::random_normal({3}, DType::f64)),
      "gelu_backward", "f32", "f64");
}

// ---- linear (the bias epilogue's CPU side)
// -------------------------------------------------------

Tensor matmul_then_add(const Tensor& x, const Tensor& w, const Tensor& b) {
  return kernels::binary(kernels::BinaryOp::Add, kernels::matmul(x, w.transpose(0, 1)), b);
}

TEST(CpuLinear, equals_matmul_then_add_bit_for_bit_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({9, 24}, dt);
    const Tensor w = test::random_normal({40, 24}, dt, Device::cpu(), 0.2);
    const Tensor b = test::random_normal({40}, dt);
    const Tensor y = kernels::linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{9, 40}));
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(all_equal(y, matmul_then_add(x, w, b)));
  }
}

TEST(CpuLinear, f64_matches_a_plain_computation) {
  const Tensor x = test::random_normal({7, 6}, DType::f64);
  const Tensor w = test::random_normal({5, 6}, DType::f64);
  const Tensor b = test::random_normal({5}, DType::f64);
  EXPECT_TRUE(all_close(kernels::linear(x, w, b),
                        from_vector(plain_linear(x, w, b), {7, 5}, DType::f64), 1e-13, 1e-13));
}

TEST(CpuLinear, strided_inputs_empty_batch_and_empty_inner_dim) {
  const Tensor x = test::random_normal({8, 5});
  const Tensor w = test::random_normal({8, 3});
  const Tensor b = test::random_normal({3});
  const Tensor xt = x.transpose(0, 1), wt = w.transpose(0, 1);
  EXPECT_TRUE(
      all_equal(kernels::linear(xt, wt, b), kernels::linear(xt.contiguous(), wt.contiguous(), b)));
  EXPECT_EQ(kernels::linear(empty({0, 8}), wt.contiguous(), b).shape(), (Shape{0, 3}));
  // in == 0: the product is empty, every row is the bias.
  EXPECT_TRUE(all_equal(kernels::linear(empty({2, 0}), empty({3, 0}), b),
                        b.unsqueeze(0).expand({2, 3}).contiguous()));
}

TEST(CpuLinear, autograd_linear_forward_is_still_matmul_then_add) {
  // Linear with a bias now runs kernels::linear: on the CPU, the same bits as before.
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({2, 3, 16}, dt);
    const Tensor w = test::random_normal({8, 16}, dt, Device::cpu(), 0.25);
    const Tensor b = test::random_normal({8}, dt);
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
    EXPECT_TRUE(all_equal(y, matmul_then_add(x.reshape({6, 16}), w, b).reshape({2, 3, 8})));
    EXPECT_TRUE(
        all_equal(linear(x, w, Tensor()),
                  kernels::matmul(x.reshape({6, 16}), w.transpose(0, 1)).reshape({2, 3, 8})));
  }
}

TEST(CpuLinear, bad_inputs_throw_naming_op_and_shapes) {
  const Tensor x = test::random_normal({4, 6});
  const Tensor w = test::random_normal({5, 6});
  const Tensor b = test::random_normal({5});
  EXPECT_ERROR(kernels::linear(x, test::random_normal({5, 7}), b), "linear", "[4, 6]", "[5, 7]");
  EXPECT_ERROR(kernels::linear(x.unsqueeze(0), w, b), "linear", "[1, 4, 6]");
  EXPECT_ERROR(kernels::linear(x, w, test::random_normal({6})), "linear", "bias", "[6]", "[5]");
  EXPECT_ERROR(kernels::linear(x, w, Tensor()), "linear", "bias", "undefined");
  EXPECT_ERROR(kernels::linear(Tensor(), w, b), "linear", "input", "undefined");
  EXPECT_ERROR(kernels::linear(x, w.to(DType::bf16), b), "linear", "weight", "f32", "bf16");
  EXPECT_ERROR(kernels::linear(x, w, b.to(DType::f16)), "linear", "bias", "f32", "f16");
  EXPECT_ERROR(kernels::linear(x.to(DType::i64), w.to(DType::i64), b.to(DType::i64)), "linear",
               "i64");
  // Through autograd, a bias of another dtype is reported by linear too.
  EXPECT_ERROR(linear(x, w, b.to(DType::f64)), "linear", "bias", "f32", "f64");
}

// ---- residual + layer norm ---------------------------------------------------------------------

TEST(CpuResidualLayerNorm, equals_add_then_layer_norm_bit_for_bit) {
  struct Case {
    DType x, params;
  };
  const Case cases[] = {{DType::f32, DType::f32},   {DType::f64, DType::f64},
                        {DType::bf16, DType::bf16}, {DType::f16, DType::f16},
                        {DType::bf16, DType::f32},  {DType::f16, DType::f32}};
  for (const Case& c : cases) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(c.x)) + " params " + dtype_name(c.params) +
                   (affine ? " affine" : " plain"));
      const Tensor x = test::random_normal({3, 4, 40}, c.x);
      const Tensor res = test::random_normal({3, 4, 40}, c.x, Device::cpu(), 3.0);
      const Tensor w = affine ? test::random_normal({40}, c.params) : Tensor();
      const Tensor b = affine ? test::random_normal({40}, c.params) : Tensor();
      const kernels::ResidualLayerNormOutput r = kernels::residual_layer_norm(x, res, w, b, 1e-5);
      const Tensor sum = kernels::binary(kernels::BinaryOp::Add, x, res);
      const kernels::LayerNormOutput ln = kernels::layer_norm(sum, w, b, 1e-5);
      EXPECT_TRUE(all_equal(r.sum, sum));
      EXPECT_TRUE(all_equal(r.out, ln.out));
      EXPECT_TRUE(all_equal(r.mean, ln.mean));
      EXPECT_TRUE(all_equal(r.rstd, ln.rstd));
      EXPECT_EQ(r.mean.shape(), (Shape{3, 4}));
      EXPECT_EQ(r.mean.dtype(), c.x == DType::f64 ? DType::f64 : DType::f32);
    }
  }
}

TEST(CpuResidualLayerNorm, f64_matches_the_formula) {
  const int64_t rows = 5, d = 12;
  const Tensor x = test::random_normal({rows, d}, DType::f64);
  const Tensor res = test::random_normal({rows, d}, DType::f64);
  const Tensor w = test::random_normal({d}, DType::f64);
  const Tensor b = test::random_normal({d}, DType::f64);
  const double eps = 1e-3;
  const kernels::ResidualLayerNormOutput r = kernels::residual_layer_norm(x, res, w, b, eps);
  const std::vector<double> vx = values(x), vr = values(res), vw = values(w), vb = values(b);
  const std::vector<double> out = values(r.out), sum = values(r.sum), mean = values(r.mean),
                            rstd = values(r.rstd);
  for (int64_t i = 0; i < rows; ++i) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < d; ++c)
      mu += vx[i * d + c] + vr[i * d + c];
    mu /= d;
    for (int64_t c = 0; c < d; ++c)
      var += (vx[i * d + c] + vr[i * d + c] - mu) * (vx[i * d + c] + vr[i * d + c] - mu);
    var /= d;
    const double rs = 1.0 / std::sqrt(var + eps);
    EXPECT_NEAR(mean[i], mu, 1e-13);
    EXPECT_NEAR(rstd[i], rs, 1e-12 * rs);
    for (int64_t c = 0; c < d; ++c) {
      const double s = vx[i * d + c] + vr[i * d + c];
      EXPECT_EQ(sum[i * d + c], s);
      EXPECT_NEAR(out[i * d + c], (s - mu) * rs * vw[c] + vb[c], 1e-12);
    }
  }
}

TEST(CpuResidualLayerNorm, strided_inputs_and_empty_rows) {
  const Tensor x = test::random_normal({16, 6});
  const Tensor res = test::random_normal({6, 16});
  const Tensor xt = x.transpose(0, 1), rt = res;  // [6, 16]: one transposed, one plain
  const kernels::ResidualLayerNormOutput a =
      kernels::residual_layer_norm(xt, rt, Tensor(), Tensor(), 1e-5);
  const kernels::ResidualLayerNormOutput b =
      kernels::residual_layer_norm(xt.contiguous(), rt, Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(all_equal(a.sum, b.sum));
  EXPECT_TRUE(all_equal(a.out, b.out));
  const kernels::ResidualLayerNormOutput none =
      kernels::residual_layer_norm(empty({0, 8}), empty({0, 8}), ones({8}), zeros({8}), 1e-5);
  EXPECT_EQ(none.sum.shape(), (Shape{0, 8}));
  EXPECT_EQ(none.mean.shape(), (Shape{0}));
}

TEST(CpuResidualLayerNorm, bad_inputs_throw_naming_op_and_shapes) {
  const Tensor x = test::random_normal({4, 8});
  const Tensor w = ones({8}), b = zeros({8});
  EXPECT_ERROR(kernels::residual_layer_norm(x, test::random_normal({4, 9}), w, b, 1e-5),
               "residual_layer_norm", "[4, 8]", "[4, 9]");
  EXPECT_ERROR(kernels::residual_layer_norm(x, x.to(DType::f64), w, b, 1e-5), "residual_layer_norm",
               "f32", "f64");
  EXPECT_ERROR(kernels::residual_layer_norm(x, x, ones({7}), b, 1e-5), "residual_layer_norm",
               "weight", "[7]", "[8]");
  EXPECT_ERROR(kernels::residual_layer_norm(x, x, w, zeros({8}, DType::f64), 1e-5),
               "residual_layer_norm", "bias", "f64");
  EXPECT_ERROR(kernels::residual_layer_norm(x.to(DType::f64), x.to(DType::f64), w, b, 1e-5),
               "residual_layer_norm", "weight", "f32", "expected f64");
  EXPECT_ERROR(kernels::residual_layer_norm(x, x, w, b, -1.0), "residual_layer_norm", "eps", "-1");
  EXPECT_ERROR(kernels::residual_layer_norm(empty({4, 0}), empty({4, 0}), Tensor(), Tensor(), 1e-5),
               "residual_layer_norm", "[4, 0]");
  EXPECT_ERROR(kernels::residual_layer_norm(Tensor(), x, w, b, 1e-5), "residual_layer_norm",
               "undefined");
}

}  // namespace
}  // namespace accrue
