// The CPU reference of the transformer kernels: dropout (kernels/dropout.h),
// linear + bias (+ GELU), the residual add fused with LayerNorm, RMSNorm (and
// its residual form), the rotary embedding and SwiGLU (kernels/fused.h),
// against plain computations written here and the unfused kernels they replace.
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

// matmul_gelu_backward on the CPU is matmul then gelu_backward, bit for bit
// in every dtype, strided inputs read as the matrices they show; an empty
// product gives gelu_backward of zeros.
TEST(CpuLinearGelu, matmul_gelu_backward_is_matmul_then_gelu_backward) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor g = test::random_normal({7, 5}, dt);
    const Tensor w = test::random_normal({5, 16}, dt, Device::cpu(), 0.5);
    const Tensor pre = test::random_normal({7, 16}, dt, Device::cpu(), 2.0);
    const Tensor dpre = kernels::matmul_gelu_backward(g, w, pre);
    EXPECT_EQ(dpre.shape(), (Shape{7, 16}));
    EXPECT_EQ(dpre.dtype(), dt);
    EXPECT_TRUE(all_equal(dpre, kernels::gelu_backward(kernels::matmul(g, w), pre)));
  }
  const Tensor g = test::random_normal({5, 7}), w = test::random_normal({16, 5}),
               pre = test::random_normal({16, 7});
  const Tensor gt = g.transpose(0, 1), wt = w.transpose(0, 1), pt = pre.transpose(0, 1);
  EXPECT_TRUE(
      all_equal(kernels::matmul_gelu_backward(gt, wt, pt),
                kernels::matmul_gelu_backward(gt.contiguous(), wt.contiguous(), pt.contiguous())));
  const Tensor p2 = test::random_normal({2, 3});
  EXPECT_TRUE(all_equal(kernels::matmul_gelu_backward(empty({2, 0}), empty({0, 3}), p2),
                        kernels::gelu_backward(zeros({2, 3}), p2)));
}

TEST(CpuLinearGelu, matmul_gelu_backward_bad_inputs_throw_naming_op_and_shapes) {
  const Tensor g = test::random_normal({4, 6}), w = test::random_normal({6, 8}),
               pre = test::random_normal({4, 8});
  const char* op = "matmul_gelu_backward";
  EXPECT_ERROR(kernels::matmul_gelu_backward(g, test::random_normal({5, 8}), pre), op, "[4, 6]",
               "[5, 8]");
  EXPECT_ERROR(kernels::matmul_gelu_backward(g.unsqueeze(0), w, pre), op, "[1, 4, 6]");
  EXPECT_ERROR(kernels::matmul_gelu_backward(g, w, test::random_normal({4, 9})), op,
               "pre_activation", "[4, 9]", "[4, 8]");
  EXPECT_ERROR(kernels::matmul_gelu_backward(g, w.to(DType::bf16), pre), op, "f32", "bf16");
  EXPECT_ERROR(kernels::matmul_gelu_backward(g, w, pre.to(DType::f64)), op, "f32", "f64");
  EXPECT_ERROR(
      kernels::matmul_gelu_backward(g.to(DType::i64), w.to(DType::i64), pre.to(DType::i64)), op,
      "i64");
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

// ---- RMSNorm ---------------------------------------------------------------------------------

// x / sqrt(mean(x^2) + eps) * w over the last dim, in double from x's values.
std::vector<double> rms_norm_formula(const Tensor& x, const Tensor& w, double eps,
                                     std::vector<double>* rstd = nullptr) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const std::vector<double> vx = values(x.contiguous());
  const std::vector<double> vw = w.defined() ? values(w) : std::vector<double>(d, 1.0);
  std::vector<double> out(vx.size());
  if (rstd) rstd->assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < d; ++c)
      ss += vx[r * d + c] * vx[r * d + c];
    const double rs = 1.0 / std::sqrt(ss / d + eps);
    if (rstd) (*rstd)[r] = rs;
    for (int64_t c = 0; c < d; ++c)
      out[r * d + c] = vx[r * d + c] * rs * vw[c];
  }
  return out;
}

TEST(CpuRmsNorm, f64_matches_the_formula_with_and_without_weight) {
  for (bool affine : {true, false}) {
    SCOPED_TRACE(affine ? "weight" : "no weight");
    const Tensor x = test::random_normal({3, 5, 24}, DType::f64, Device::cpu(), 2.0);
    const Tensor w = affine ? test::random_normal({24}, DType::f64) : Tensor();
    const kernels::RmsNormOutput r = kernels::rms_norm(x, w, 1e-3);
    std::vector<double> rstd;
    const std::vector<double> expected = rms_norm_formula(x, w, 1e-3, &rstd);
    EXPECT_TRUE(all_close(r.out, from_vector(expected, x.shape(), DType::f64), 1e-13, 1e-14));
    EXPECT_EQ(r.rstd.shape(), (Shape{3, 5}));
    EXPECT_EQ(r.rstd.dtype(), DType::f64);
    EXPECT_TRUE(all_close(r.rstd, from_vector(rstd, {3, 5}, DType::f64), 1e-13, 0.0));
  }
}

TEST(CpuRmsNorm, every_dtype_rounds_the_f64_result_once) {
  struct Case {
    DType x, params;
  };
  const Case cases[] = {{DType::f32, DType::f32},
                        {DType::bf16, DType::bf16},
                        {DType::f16, DType::f16},
                        {DType::bf16, DType::f32},
                        {DType::f16, DType::f32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.x)) + " params " + dtype_name(c.params));
    const Tensor x = test::random_normal({7, 40}, c.x);
    const Tensor w = test::random_normal({40}, c.params);
    const kernels::RmsNormOutput r = kernels::rms_norm(x, w, 1e-5);
    EXPECT_EQ(r.out.dtype(), c.x);
    EXPECT_EQ(r.rstd.dtype(), DType::f32);
    // The formula over the stored inputs, rounded once to x's dtype.
    const Tensor expected = from_vector(rms_norm_formula(x, w, 1e-5), x.shape(), DType::f64);
    EXPECT_TRUE(all_equal(r.out, expected.to(DType::f32).to(c.x)));
  }
}

TEST(CpuRmsNorm, per_head_qk_norm_of_a_packed_qkv_view) {
  // q and k of a packed [B, T, 3, H, D] qkv: strided [B, T, H, D] views,
  // each normalized over D with one [D] weight.
  const int64_t b = 2, t = 3, h = 4, d = 8;
  const Tensor qkv = test::random_normal({b, t, 3, h, d});
  const Tensor w = test::random_normal({d});
  for (int64_t which : {0, 1}) {
    const Tensor q = qkv.select(2, which);
    ASSERT_FALSE(q.is_contiguous());
    const kernels::RmsNormOutput r = kernels::rms_norm(q, w, 1e-6);
    EXPECT_EQ(r.out.shape(), (Shape{b, t, h, d}));
    EXPECT_EQ(r.rstd.shape(), (Shape{b, t, h}));
    EXPECT_TRUE(all_equal(r.out, kernels::rms_norm(q.contiguous(), w, 1e-6).out));
    EXPECT_TRUE(all_close(
        r.out, from_vector(rms_norm_formula(q, w, 1e-6), q.shape(), DType::f64).to(DType::f32),
        1e-6, 1e-6));
    // Three strided levels ([T, B, H, D] of the same qkv) go through a copy.
    const Tensor tq = q.transpose(0, 1);
    EXPECT_TRUE(all_equal(kernels::rms_norm(tq, w, 1e-6).out,
                          kernels::rms_norm(tq.contiguous(), w, 1e-6).out));
    // The backward reads the view in place too.
    const Tensor g = test::random_normal({b, t, h, d});
    const kernels::RmsNormOutput rc = kernels::rms_norm(q.contiguous(), w, 1e-6);
    Tensor dw = empty({d}), dwc = empty({d});
    EXPECT_TRUE(all_equal(kernels::rms_norm_backward(g, q, w, r.rstd, dw, false),
                          kernels::rms_norm_backward(g, q.contiguous(), w, rc.rstd, dwc, false)));
    EXPECT_TRUE(all_equal(dw, dwc));
  }
}

TEST(CpuRmsNorm, backward_matches_the_derivative_formula_and_accumulates_dweight) {
  const int64_t rows = 6, d = 10;
  const Tensor x = test::random_normal({rows, d}, DType::f64);
  const Tensor w = test::random_normal({d}, DType::f64);
  const Tensor g = test::random_normal({rows, d}, DType::f64);
  const double eps = 1e-4;
  const kernels::RmsNormOutput r = kernels::rms_norm(x, w, eps);
  Tensor dw = empty({d}, DType::f64);
  const Tensor dx = kernels::rms_norm_backward(g, x, w, r.rstd, dw, false);
  // d/dx_j of sum_i g_i w_i x_i rs with rs = (mean(x^2) + eps)^-1/2:
  //   g_j w_j rs - x_j rs^3 / d * sum_i g_i w_i x_i.
  const std::vector<double> vx = values(x), vw = values(w), vg = values(g);
  std::vector<double> edx(rows * d), edw(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0.0, dot = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      ss += vx[i * d + c] * vx[i * d + c];
      dot += vg[i * d + c] * vw[c] * vx[i * d + c];
    }
    const double rs = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t c = 0; c < d; ++c) {
      edx[i * d + c] = vg[i * d + c] * vw[c] * rs - vx[i * d + c] * rs * rs * rs / d * dot;
      edw[c] += vg[i * d + c] * vx[i * d + c] * rs;
    }
  }
  EXPECT_TRUE(all_close(dx, from_vector(edx, {rows, d}, DType::f64), 1e-12, 1e-13));
  EXPECT_TRUE(all_close(dw, from_vector(edw, {d}, DType::f64), 1e-12, 1e-13));
  // accumulate adds to what is there; an f32 dweight (an arena slot) works too.
  kernels::rms_norm_backward(g, x, w, r.rstd, dw, true);
  EXPECT_TRUE(all_close(
      dw, kernels::binary_scalar(kernels::BinaryOp::Mul, from_vector(edw, {d}, DType::f64), 2.0),
      1e-12, 1e-13));
  const Tensor x16 = x.to(DType::bf16), g16 = g.to(DType::bf16);
  const kernels::RmsNormOutput r16 = kernels::rms_norm(x16, w.to(DType::f32), eps);
  Tensor dw32 = empty({d}, DType::f32);
  kernels::rms_norm_backward(g16, x16, w.to(DType::f32), r16.rstd, dw32, false);
  EXPECT_TRUE(all_close(dw32, from_vector(edw, {d}, DType::f64), 3e-2, 3e-2));
  // No weight: dx only.
  const kernels::RmsNormOutput plain = kernels::rms_norm(x, Tensor(), eps);
  const Tensor dx_plain = kernels::rms_norm_backward(g, x, Tensor(), plain.rstd, Tensor(), false);
  EXPECT_EQ(dx_plain.shape(), (Shape{rows, d}));
}

// Note [Fan-out sums in the backward]: dx_add is added to dx before its one
// rounding, and dweight's partial sums do not see it.
TEST(CpuRmsNorm, backward_adds_dx_add_before_rounding_and_refuses_bad_ones) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({7, 10}, dt);
    const Tensor w = test::random_normal({10}, dt);
    const Tensor g = test::random_normal({7, 10}, dt);
    const Tensor add = test::random_normal({7, 10}, dt);
    const kernels::RmsNormOutput f = kernels::rms_norm(x, w, 1e-5);
    kernels::NormPartials p, p_add;
    const Tensor dx = kernels::rms_norm_backward_partials(g, x, w, f.rstd, true, &p);
    const Tensor dx_add = kernels::rms_norm_backward_partials(g, x, w, f.rstd, true, &p_add, add);
    const Tensor sum =
        kernels::binary(kernels::BinaryOp::Add, dx.to(DType::f64), add.to(DType::f64)).to(dt);
    EXPECT_TRUE(
        test::close(dx_add, sum, dt == DType::f64 ? 1e-14 : test::normalized_tolerance(dt)));
    EXPECT_TRUE(test::all_equal(p_add.dweight, p.dweight));
  }
  const Tensor x = test::random_normal({4, 8});
  const kernels::RmsNormOutput r = kernels::rms_norm(x, ones({8}), 1e-5);
  kernels::NormPartials p;
  EXPECT_ERROR(
      kernels::rms_norm_backward_partials(x, x, ones({8}), r.rstd, true, &p, zeros({8, 4})),
      "rms_norm_backward", "dx_add", "[8, 4]", "[4, 8]");
  EXPECT_ERROR(kernels::rms_norm_backward_partials(x, x, ones({8}), r.rstd, true, &p,
                                                   zeros({4, 8}, DType::f16)),
               "rms_norm_backward", "f16", "f32");
}

TEST(CpuRmsNorm, empty_rows_and_bad_inputs) {
  const kernels::RmsNormOutput none = kernels::rms_norm(empty({0, 8}), ones({8}), 1e-5);
  EXPECT_EQ(none.out.shape(), (Shape{0, 8}));
  EXPECT_EQ(none.rstd.shape(), (Shape{0}));
  const Tensor x = test::random_normal({4, 8});
  EXPECT_ERROR(kernels::rms_norm(x, ones({7}), 1e-5), "rms_norm", "weight", "[7]", "[8]");
  EXPECT_ERROR(kernels::rms_norm(x, ones({8}, DType::f64), 1e-5), "rms_norm", "weight", "f64",
               "expected f32");
  EXPECT_ERROR(kernels::rms_norm(x.to(DType::f64), ones({8}), 1e-5), "rms_norm", "weight", "f32",
               "expected f64");
  EXPECT_ERROR(kernels::rms_norm(x, ones({8}), 0.0), "rms_norm", "eps", "> 0", "got 0");
  EXPECT_ERROR(kernels::rms_norm(x, ones({8}), -1e-5), "rms_norm", "eps", "-1e-05");
  EXPECT_ERROR(kernels::rms_norm(ones({4, 8}, DType::i32), Tensor(), 1e-5), "rms_norm", "i32");
  EXPECT_ERROR(kernels::rms_norm(empty({4, 0}), Tensor(), 1e-5), "rms_norm", "[4, 0]");
  EXPECT_ERROR(kernels::rms_norm(Tensor(), Tensor(), 1e-5), "rms_norm", "undefined");
  const kernels::RmsNormOutput r = kernels::rms_norm(x, ones({8}), 1e-5);
  EXPECT_ERROR(kernels::rms_norm_backward(x, x, ones({8}), ones({3}), Tensor(), false),
               "rms_norm_backward", "rstd", "[3]");
  EXPECT_ERROR(kernels::rms_norm_backward(x, x, ones({8}), r.rstd, empty({9}), false),
               "rms_norm_backward", "dweight", "[9]");
  EXPECT_ERROR(kernels::rms_norm_backward(test::random_normal({4, 9}), x, ones({8}), r.rstd,
                                          Tensor(), false),
               "rms_norm_backward", "[4, 9]", "[4, 8]");
}

TEST(CpuAddRmsNorm, equals_add_then_rms_norm_bit_for_bit) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({3, 4, 40}, dt);
    const Tensor res = test::random_normal({3, 4, 40}, dt, Device::cpu(), 3.0);
    const Tensor w = test::random_normal({40}, dt);
    const kernels::ResidualRmsNormOutput r = kernels::add_rms_norm(x, res, w, 1e-5);
    const Tensor sum = kernels::binary(kernels::BinaryOp::Add, x, res);
    const kernels::RmsNormOutput n = kernels::rms_norm(sum, w, 1e-5);
    EXPECT_TRUE(all_equal(r.sum, sum));
    EXPECT_TRUE(all_equal(r.out, n.out));
    EXPECT_TRUE(all_equal(r.rstd, n.rstd));
  }
  // f64 against the formula over x + residual.
  const Tensor x = test::random_normal({5, 12}, DType::f64);
  const Tensor res = test::random_normal({5, 12}, DType::f64);
  const Tensor w = test::random_normal({12}, DType::f64);
  const kernels::ResidualRmsNormOutput r = kernels::add_rms_norm(x, res, w, 1e-6);
  const std::vector<double> vx = values(x), vr = values(res);
  std::vector<double> s(vx.size());
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = vx[i] + vr[i];
  const Tensor st = from_vector(s, {5, 12}, DType::f64);
  EXPECT_TRUE(all_equal(r.sum, st));
  EXPECT_TRUE(all_close(r.out, from_vector(rms_norm_formula(st, w, 1e-6), {5, 12}, DType::f64),
                        1e-13, 1e-14));
}

TEST(CpuAddRmsNorm, strided_inputs_and_bad_inputs) {
  const Tensor x = test::random_normal({16, 6});
  const Tensor res = test::random_normal({6, 16});
  const kernels::ResidualRmsNormOutput a =
      kernels::add_rms_norm(x.transpose(0, 1), res, Tensor(), 1e-5);
  const kernels::ResidualRmsNormOutput b =
      kernels::add_rms_norm(x.transpose(0, 1).contiguous(), res, Tensor(), 1e-5);
  EXPECT_TRUE(all_equal(a.sum, b.sum));
  EXPECT_TRUE(all_equal(a.out, b.out));
  const Tensor y = test::random_normal({4, 8});
  EXPECT_ERROR(kernels::add_rms_norm(y, test::random_normal({4, 9}), ones({8}), 1e-5),
               "add_rms_norm", "[4, 8]", "[4, 9]");
  EXPECT_ERROR(kernels::add_rms_norm(y, y.to(DType::f64), ones({8}), 1e-5), "add_rms_norm", "f32",
               "f64");
  EXPECT_ERROR(kernels::add_rms_norm(y, y, ones({7}), 1e-5), "add_rms_norm", "weight", "[7]");
  EXPECT_ERROR(kernels::add_rms_norm(y, y, ones({8}), 0.0), "add_rms_norm", "eps");
}

// ---- rotary embedding -------------------------------------------------------------------------

// transformers' LlamaRotaryEmbedding (default and rope_type "llama3") and
// apply_rotary_pos_emb, written from their formulas: inv_freq in f32, then
// the llama3 rescaling, angle = position * inv_freq, cos and sin in f32.
std::vector<float> hf_inv_freq(int64_t d, double theta, const RopeScaling& s) {
  std::vector<float> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    // base ** (arange(0, dim, 2).float() / dim), then 1.0 / that.
    const float e = static_cast<float>(2 * i) / static_cast<float>(d);
    inv[i] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(e)));
  }
  if (s.type != RopeScaling::Type::llama3) return inv;
  const double old = static_cast<double>(s.original_max_position);
  const float low_freq_wavelen = static_cast<float>(old / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old / s.high_freq_factor);
  for (float& f : inv) {
    // wavelen = 2 * math.pi / inv_freq (a reciprocal times the scalar in torch)
    const float wavelen = (1.0f / f) * static_cast<float>(2 * M_PI);
    float llama = wavelen > low_freq_wavelen ? f / static_cast<float>(s.factor) : f;
    const float smooth =
        ((1.0f / wavelen) * static_cast<float>(old) - static_cast<float>(s.low_freq_factor)) /
        static_cast<float>(s.high_freq_factor - s.low_freq_factor);
    const float smoothed = (1.0f - smooth) * llama / static_cast<float>(s.factor) + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv;
}

// x [B, T, H, D] rotated at positions [B, T] (flattened), in double from the
// f32 cos/sin of hf_inv_freq (or, for the f64 reference, all in double).
std::vector<double> rope_reference(const Tensor& x, const std::vector<int64_t>& pos, double theta,
                                   RopeStyle style, const RopeScaling& s, bool in_f64) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  const std::vector<double> vx = values(x.contiguous());
  const std::vector<float> inv32 = hf_inv_freq(d, theta, s);
  std::vector<double> out(vx.size());
  for (int64_t bt = 0; bt < b * t; ++bt) {
    for (int64_t i = 0; i < half; ++i) {
      double c, sn;
      if (in_f64) {
        double inv = 1.0 / std::pow(theta, 2.0 * i / d);
        if (s.type == RopeScaling::Type::llama3) {
          const double wavelen = 2 * M_PI / inv, old = s.original_max_position;
          if (wavelen > old / s.low_freq_factor) {
            inv /= s.factor;
          } else if (wavelen >= old / s.high_freq_factor) {
            const double sm =
                (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            inv = (1 - sm) * inv / s.factor + sm * inv;
          }
        }
        c = std::cos(pos[bt] * inv);
        sn = std::sin(pos[bt] * inv);
      } else {
        const float angle = static_cast<float>(pos[bt]) * inv32[i];
        c = std::cos(angle);
        sn = std::sin(angle);
      }
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t base = (bt * h + hh) * d;
        const int64_t ia = style == RopeStyle::RotateHalf ? i : 2 * i;
        const int64_t ib = style == RopeStyle::RotateHalf ? i + half : 2 * i + 1;
        // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1).
        out[base + ia] = vx[base + ia] * c - vx[base + ib] * sn;
        out[base + ib] = vx[base + ib] * c + vx[base + ia] * sn;
      }
    }
  }
  return out;
}

std::vector<int64_t> random_positions(int64_t n, int64_t hi) {
  const std::vector<double> u = values(test::random_uniform({n}, 0.0, static_cast<double>(hi)));
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i)
    p[i] = static_cast<int64_t>(u[i]);
  return p;
}

const RopeScaling kLlama3 = RopeScaling::llama3(8.0, 1.0, 4.0, 8192);

TEST(CpuRope, f32_matches_transformers_formula_both_styles_with_and_without_llama3_scaling) {
  const int64_t b = 2, t = 5, h = 3, d = 64;
  const std::vector<int64_t> pos = random_positions(b * t, 20000);
  const Tensor positions = from_vector<int64_t>(pos, {b, t});
  for (auto style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
    for (const RopeScaling& s : {RopeScaling{}, kLlama3}) {
      for (double theta : {10000.0, 500000.0}) {
        SCOPED_TRACE(std::string(style == RopeStyle::RotateHalf ? "rotate_half" : "interleaved") +
                     (s.type == RopeScaling::Type::llama3 ? " llama3" : " plain") + " theta " +
                     std::to_string(theta));
        const Tensor x = test::random_normal({b, t, h, d});
        const Tensor y = kernels::rope(x, positions, theta, style, s);
        EXPECT_EQ(y.shape(), (Shape{b, t, h, d}));
        EXPECT_TRUE(y.is_contiguous());
        const Tensor expected =
            from_vector(rope_reference(x, pos, theta, style, s, false), x.shape(), DType::f64);
        EXPECT_TRUE(all_close(y, expected, 1e-5, 1e-5));
      }
    }
  }
}

TEST(CpuRope, f64_matches_the_exact_formula_and_llama3_changes_low_frequencies_only) {
  const int64_t b = 1, t = 7, h = 2, d = 128;
  const std::vector<int64_t> pos = random_positions(b * t, 100000);
  const Tensor positions = from_vector<int64_t>(pos, {t});
  for (auto style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
    for (const RopeScaling& s : {RopeScaling{}, kLlama3}) {
      const Tensor x = test::random_normal({b, t, h, d}, DType::f64);
      const Tensor y = kernels::rope(x, positions, 500000.0, style, s);
      EXPECT_TRUE(all_close(
          y, from_vector(rope_reference(x, pos, 500000.0, style, s, true), x.shape(), DType::f64),
          1e-9, 1e-9));
    }
  }
  // Llama 3's scaling divides the lowest frequency by the factor and keeps the highest.
  const std::vector<float> plain = hf_inv_freq(128, 500000.0, {});
  const std::vector<float> scaled = hf_inv_freq(128, 500000.0, kLlama3);
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_FLOAT_EQ(scaled[63], plain[63] / 8.0f);
}

TEST(CpuRope, every_dtype_rounds_once_and_inverse_undoes_it) {
  const int64_t b = 2, t = 4, h = 2, d = 16;
  const std::vector<int64_t> pos = random_positions(b * t, 4096);
  const Tensor positions = from_vector<int64_t>(pos, {b, t});
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({b, t, h, d}, dt);
    const Tensor y = kernels::rope(x, positions, 10000.0, RopeStyle::RotateHalf);
    EXPECT_EQ(y.dtype(), dt);
    const Tensor expected =
        from_vector(rope_reference(x, pos, 10000.0, RopeStyle::RotateHalf, {}, dt == DType::f64),
                    x.shape(), DType::f64);
    EXPECT_TRUE(all_close(y, expected, test::default_rtol(dt), test::default_atol(dt)));
    // The rotation by -angle undoes it (up to the rounding of y).
    const Tensor back = kernels::rope(y, positions, 10000.0, RopeStyle::RotateHalf, {}, true);
    EXPECT_TRUE(all_close(back, x, 4 * test::default_rtol(dt), 4 * test::default_atol(dt)));
  }
}

TEST(CpuRope, position_zero_is_the_identity_and_packed_documents_restart) {
  const int64_t h = 3, d = 8;
  const Tensor x = test::random_normal({1, 6, h, d});
  // Two packed documents of 3 tokens: positions 0 1 2 0 1 2.
  const Tensor packed = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {1, 6});
  const Tensor y = kernels::rope(x, packed, 10000.0, RopeStyle::RotateHalf);
  EXPECT_TRUE(all_equal(y.select(1, 0), x.select(1, 0)));
  EXPECT_TRUE(all_equal(y.select(1, 3), x.select(1, 3)));
  // The second document rotated alone from 0 gives the same values.
  const Tensor second = x.narrow(1, 3, 3);
  const Tensor alone =
      kernels::rope(second, from_vector<int64_t>({0, 1, 2}, {3}), 10000.0, RopeStyle::RotateHalf);
  EXPECT_TRUE(all_equal(y.narrow(1, 3, 3).contiguous(), alone));
  // [T] positions are shared by the batch.
  const Tensor x2 = test::random_normal({2, 3, h, d});
  const Tensor shared =
      kernels::rope(x2, from_vector<int64_t>({4, 9, 1}, {3}), 10000.0, RopeStyle::Interleaved);
  const Tensor full = kernels::rope(x2, from_vector<int64_t>({4, 9, 1, 4, 9, 1}, {2, 3}), 10000.0,
                                    RopeStyle::Interleaved);
  EXPECT_TRUE(all_equal(shared, full));
}

TEST(CpuRope, interleaved_is_rotate_half_of_the_deinterleaved_head) {
  const int64_t b = 2, t = 3, h = 2, d = 10;
  const Tensor x = test::random_normal({b, t, h, d}, DType::f64);
  const Tensor positions = from_vector<int64_t>({3, 1, 4, 1, 5, 9}, {b, t});
  // x viewed [.., D/2, 2] and transposed to [.., 2, D/2]: pair i at (i, i + D/2).
  const Tensor halves = x.view({b, t, h, d / 2, 2}).transpose(3, 4).contiguous().view({b, t, h, d});
  const Tensor a = kernels::rope(x, positions, 100.0, RopeStyle::Interleaved);
  const Tensor c = kernels::rope(halves, positions, 100.0, RopeStyle::RotateHalf);
  EXPECT_TRUE(
      all_equal(a.view({b, t, h, d / 2, 2}).transpose(3, 4).contiguous().view({b, t, h, d}), c));
}

TEST(CpuRope, q_and_k_of_a_packed_qkv_are_read_in_place) {
  const int64_t b = 2, t = 5, h = 4, d = 16;
  const Tensor qkv = test::random_normal({b, t, 3 * h * d}, DType::bf16);
  const Tensor positions = from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 0, 1, 2}, {b, t});
  const Tensor view = qkv.view({b, t, 3, h, d});
  for (int64_t which : {0, 1}) {
    const Tensor q = view.select(2, which);
    ASSERT_FALSE(q.is_contiguous());
    EXPECT_TRUE(
        all_equal(kernels::rope(q, positions, 10000.0, RopeStyle::RotateHalf),
                  kernels::rope(q.contiguous(), positions, 10000.0, RopeStyle::RotateHalf)));
  }
}

TEST(CpuRope, in_place_rotates_q_and_k_where_they_lie_in_a_packed_qkv) {
  const int64_t b = 2, t = 4, h = 3, d = 8;
  const Tensor pos = from_vector<int64_t>({0, 1, 2, 3, 0, 1, 0, 1}, {b, t});
  const Tensor qkv = test::random_normal({b, t, 3 * h * d}, DType::bf16);
  const Tensor before = qkv.clone();
  const Tensor view = qkv.view({b, t, 3, h, d}), old = before.view({b, t, 3, h, d});
  kernels::rope_(view.select(2, 0), pos, 1e4, RopeStyle::RotateHalf);
  kernels::rope_(view.select(2, 1), pos, 1e4, RopeStyle::Interleaved);
  EXPECT_TRUE(all_equal(view.select(2, 0).contiguous(),
                        kernels::rope(old.select(2, 0), pos, 1e4, RopeStyle::RotateHalf)));
  EXPECT_TRUE(all_equal(view.select(2, 1).contiguous(),
                        kernels::rope(old.select(2, 1), pos, 1e4, RopeStyle::Interleaved)));
  EXPECT_TRUE(all_equal(view.select(2, 2).contiguous(), old.select(2, 2).contiguous()));
  // The rotation by -angle, in place, brings q back (up to bf16 rounding).
  kernels::rope_(view.select(2, 0), pos, 1e4, RopeStyle::RotateHalf, {}, true);
  EXPECT_TRUE(all_close(view.select(2, 0).contiguous(), old.select(2, 0).contiguous(), 2e-2, 2e-2));
  EXPECT_ERROR(kernels::rope_(test::random_normal({1, t, h, d}).expand({b, t, h, d}), pos, 1e4,
                              RopeStyle::RotateHalf),
               "rope_", "overlaps", "rope instead");
  EXPECT_ERROR(kernels::rope_(test::random_normal({b, t, d, h}).transpose(2, 3), pos, 1e4,
                              RopeStyle::RotateHalf),
               "rope_", "stride 1");
  EXPECT_ERROR(kernels::rope_(test::random_normal({b, t, h, 5}), pos, 1e4, RopeStyle::RotateHalf),
               "rope_", "head dim D = 5");
}

TEST(CpuRope, bad_inputs_throw_naming_op_and_values) {
  const Tensor x = test::random_normal({2, 3, 4, 8});
  const Tensor pos = from_vector<int64_t>({0, 1, 2}, {3});
  const auto rh = RopeStyle::RotateHalf;
  EXPECT_ERROR(kernels::rope(test::random_normal({2, 3, 8}), pos, 1e4, rh), "rope", "[2, 3, 8]",
               "[B, T, H, D]");
  EXPECT_ERROR(kernels::rope(test::random_normal({2, 3, 4, 7}), pos, 1e4, rh), "rope",
               "head dim D = 7", "even");
  EXPECT_ERROR(kernels::rope(x, pos.to(DType::i32), 1e4, rh), "rope", "positions", "i32", "i64");
  EXPECT_ERROR(kernels::rope(x, from_vector<int64_t>({0, 1}, {2}), 1e4, rh), "rope", "positions",
               "[2]", "[2, 3] or [3]");
  EXPECT_ERROR(kernels::rope(x, from_vector<int64_t>({0, -1, 2}, {3}), 1e4, rh), "rope",
               "positions", "-1");
  EXPECT_ERROR(kernels::rope(x, from_vector<int64_t>({0, int64_t{1} << 24, 2}, {3}), 1e4, rh),
               "rope", "positions", "16777216");
  EXPECT_ERROR(kernels::rope(x, pos, 0.0, rh), "rope", "theta", "got 0");
  EXPECT_ERROR(kernels::rope(x, pos, 1e4, rh, RopeScaling::llama3(8.0, 4.0, 1.0)), "rope", "llama3",
               "low_freq_factor 4", "high_freq_factor 1");
  EXPECT_ERROR(kernels::rope(ones({2, 3, 4, 8}, DType::i64), pos, 1e4, rh), "rope", "i64");
  EXPECT_ERROR(kernels::rope(Tensor(), pos, 1e4, rh), "rope", "undefined");
  EXPECT_ERROR(kernels::rope(x, Tensor(), 1e4, rh), "rope", "positions", "undefined");
  // Unchecked (the backward's call), a negative position rotates the other way.
  const Tensor neg = from_vector<int64_t>({0, -1, -2}, {3});
  EXPECT_TRUE(all_close(kernels::rope(x, neg, 1e4, rh, {}, false, /*check_positions=*/false),
                        kernels::rope(x, from_vector<int64_t>({0, 1, 2}, {3}), 1e4, rh, {}, true),
                        1e-6, 1e-7));
  const Tensor none = kernels::rope(empty({0, 3, 4, 8}), pos, 1e4, rh);
  EXPECT_EQ(none.shape(), (Shape{0, 3, 4, 8}));
}

// ---- SwiGLU
// --------------------------------------------------------------------------------------

double silu_of(double g) {
  return g / (1.0 + std::exp(-g));
}

TEST(CpuSwiglu, matches_the_formula_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor gate = test::random_normal({3, 5, 24}, dt, Device::cpu(), 3.0);
    const Tensor up = test::random_normal({3, 5, 24}, dt);
    const Tensor y = kernels::swiglu(gate, up);
    EXPECT_EQ(y.dtype(), dt);
    const std::vector<double> g = values(gate), u = values(up);
    std::vector<double> e(g.size());
    for (size_t i = 0; i < g.size(); ++i)
      e[i] = silu_of(g[i]) * u[i];
    EXPECT_TRUE(all_close(y, from_vector(e, gate.shape(), DType::f64), test::default_rtol(dt),
                          test::default_atol(dt)));
  }
}

TEST(CpuSwiglu, backward_matches_the_derivative_formula) {
  const Tensor gate = test::random_normal({4, 9}, DType::f64, Device::cpu(), 3.0);
  const Tensor up = test::random_normal({4, 9}, DType::f64);
  const Tensor dy = test::random_normal({4, 9}, DType::f64);
  const kernels::SwigluGrads d = kernels::swiglu_backward(dy, gate, up);
  const std::vector<double> g = values(gate), u = values(up), vy = values(dy);
  std::vector<double> eg(g.size()), eu(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    // d/dg of g sigmoid(g) = sigmoid(g) + g sigmoid(g) (1 - sigmoid(g)).
    const double s = 1.0 / (1.0 + std::exp(-g[i]));
    eg[i] = vy[i] * u[i] * (s + g[i] * s * (1.0 - s));
    eu[i] = vy[i] * silu_of(g[i]);
  }
  EXPECT_TRUE(all_close(d.dgate, from_vector(eg, {4, 9}, DType::f64), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(d.dup, from_vector(eu, {4, 9}, DType::f64), 1e-13, 1e-14));
}

TEST(CpuSwiglu, packed_halves_equal_the_split_and_strided_inputs_work) {
  const Tensor x = test::random_normal({2, 3, 16});
  const Tensor gate = x.narrow(2, 0, 8), up = x.narrow(2, 8, 8);
  const Tensor y = kernels::swiglu_packed(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
  EXPECT_TRUE(all_equal(y, kernels::swiglu(gate.contiguous(), up.contiguous())));
  EXPECT_TRUE(all_equal(kernels::swiglu(gate, up), y));
  // A transposed input is read through a copy.
  const Tensor gt = test::random_normal({8, 5}).transpose(0, 1);
  const Tensor ut = test::random_normal({5, 8});
  EXPECT_TRUE(all_equal(kernels::swiglu(gt, ut), kernels::swiglu(gt.contiguous(), ut)));
  // The packed backward is the split one, laid out [dgate | dup].
  const Tensor dy = test::random_normal({2, 3, 8});
  const Tensor dx = kernels::swiglu_packed_backward(dy, x);
  const kernels::SwigluGrads d = kernels::swiglu_backward(dy, gate, up);
  EXPECT_TRUE(all_equal(dx.narrow(2, 0, 8).contiguous(), d.dgate));
  EXPECT_TRUE(all_equal(dx.narrow(2, 8, 8).contiguous(), d.dup));
}

TEST(CpuSwiglu, bad_inputs_throw_naming_op_and_values) {
  const Tensor g = test::random_normal({4, 8});
  EXPECT_ERROR(kernels::swiglu(g, test::random_normal({4, 9})), "swiglu", "[4, 8]", "[4, 9]");
  EXPECT_ERROR(kernels::swiglu(g, g.to(DType::f64)), "swiglu", "f32", "f64");
  EXPECT_ERROR(kernels::swiglu(ones({4}, DType::i32), ones({4}, DType::i32)), "swiglu", "i32");
  EXPECT_ERROR(kernels::swiglu(g, Tensor()), "swiglu", "up", "undefined");
  EXPECT_ERROR(kernels::swiglu_packed(test::random_normal({4, 7})), "swiglu_packed", "[4, 7]",
               "even");
  EXPECT_ERROR(kernels::swiglu_packed_backward(test::random_normal({4, 3}), g),
               "swiglu_packed_backward", "[4, 3]", "[4, 4]");
  EXPECT_ERROR(kernels::swiglu_backward(g.to(DType::f64), g, g), "swiglu_backward", "f64");
}

}  // namespace
}  // namespace accrue
