// The CPU neural-network kernels (embedding, cross-entropy, layer norm, with
// their backwards) through kernels/ops.h, against hand-computed values, f64
// loops written here and central differences.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>
#include <limits>

#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

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

// Central differences of a scalar function of a vector.
std::vector<double> numeric_gradient(const std::vector<double>& x,
                                     const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> g(x.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    g[i] = (f(xp) - f(xm)) / (2 * h);
  }
  return g;
}

// ---- embedding ------------------------------------------------------------------------------

TEST(CpuEmbedding, gathers_rows_including_repeats_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    for (DType it : {DType::i32, DType::i64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(it));
      Tensor w = test::random_normal({5, 3}, dt);
      Tensor idx = from_vector<int64_t>({4, 0, 4, 2, 2, 1}, {2, 3}, it);
      Tensor out = kernels::embedding(w, idx);
      EXPECT_EQ(out.shape(), (Shape{2, 3, 3}));
      EXPECT_EQ(out.dtype(), dt);
      const std::vector<double> vw = values(w), vo = values(out);
      const int64_t rows[] = {4, 0, 4, 2, 2, 1};
      for (int p = 0; p < 6; ++p)
        for (int d = 0; d < 3; ++d)
          EXPECT_EQ(vo[p * 3 + d], vw[rows[p] * 3 + d]);
    }
  }
}

TEST(CpuEmbedding, strided_weight_zero_dim_and_empty_indices) {
  Tensor w = test::random_normal({3, 4}, DType::f32).transpose(0, 1);  // [4, 3] strided
  Tensor idx = from_vector<int64_t>({3, 1}, {2}).expand({2, 2});       // expanded indices
  Tensor out = kernels::embedding(w, idx);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  const std::vector<double> vw = values(w), vo = values(out);
  for (int p = 0; p < 4; ++p)
    for (int d = 0; d < 3; ++d)
      EXPECT_EQ(vo[p * 3 + d], vw[(p % 2 == 0 ? 3 : 1) * 3 + d]);
  Tensor one = kernels::embedding(w, scalar_tensor(2, DType::i64));
  EXPECT_EQ(one.shape(), (Shape{3}));
  EXPECT_TRUE(all_equal(one, w.select(0, 2)));
  EXPECT_EQ(kernels::embedding(w, zeros({0, 5}, DType::i32)).shape(), (Shape{0, 5, 3}));
}

// Rows hit by several positions get the sum of their gradients.
Tensor reference_embedding_grad(const Tensor& grad, const std::vector<int64_t>& idx, int64_t v,
                                int64_t d) {
  std::vector<double> r(static_cast<size_t>(v * d), 0.0);
  const std::vector<double> g = values(grad);
  for (size_t p = 0; p < idx.size(); ++p)
    for (int64_t j = 0; j < d; ++j)
      r[idx[p] * d + j] += g[p * d + j];
  return f64_tensor(r, {v, d});
}

TEST(CpuEmbedding, backward_sums_repeats_and_zeroes_rows_not_hit) {
  for (DType dt : kFloatTypes) {
    for (DType gw_dt : {dt, DType::f32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " into " + dtype_name(gw_dt));
      const std::vector<int64_t> idx = {1, 3, 1, 1, 0, 3};  // row 2 and 4 never hit
      Tensor indices = from_vector<int64_t>(idx, {2, 3});
      Tensor grad = test::random_integers({2, 3, 4}, -8, 8, dt);
      Tensor gw = empty({5, 4}, gw_dt);
      test::poison(gw);
      kernels::embedding_backward(grad, indices, gw, false);
      Tensor expected = reference_embedding_grad(grad, idx, 5, 4);
      EXPECT_TRUE(all_equal(gw, expected));
      // accumulate: rows hit add, rows not hit stay as they are.
      Tensor before = test::random_integers({5, 4}, -8, 8, gw_dt);
      Tensor acc = before.clone();
      kernels::embedding_backward(grad, indices, acc, true);
      EXPECT_TRUE(
          all_equal(acc, kernels::binary(kernels::BinaryOp::Add, before.to(DType::f64), expected)));
    }
  }
}

TEST(CpuEmbedding, backward_of_random_grads_matches_f64_and_handles_no_indices) {
  Tensor grad = test::random_normal({6, 3}, DType::bf16);
  const std::vector<int64_t> idx = {2, 2, 2, 0, 2, 2};
  Tensor gw = empty({3, 3}, DType::f32);
  kernels::embedding_backward(grad, from_vector<int64_t>(idx, {6}, DType::i32), gw, false);
  EXPECT_TRUE(all_close(gw, reference_embedding_grad(grad, idx, 3, 3)));
  // No indices: written as zeros, or left alone when accumulating.
  Tensor z = full({3, 3}, 5.0);
  kernels::embedding_backward(zeros({0, 3}), zeros({0}, DType::i64), z, true);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(9, 5.0f));
  kernels::embedding_backward(zeros({0, 3}), zeros({0}, DType::i64), z, false);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(9, 0.0f));
}

TEST(CpuEmbedding, bad_inputs_throw_naming_op_and_values) {
  Tensor w = zeros({5, 3});
  EXPECT_ERROR(kernels::embedding(w, from_vector<int64_t>({1, 7, 2}, {3})), "embedding", "index 7",
               "out of range [0, 5)");
  EXPECT_ERROR(kernels::embedding(w, from_vector<int64_t>({-1}, {1}, DType::i32)), "embedding",
               "index -1", "[0, 5)");
  EXPECT_ERROR(kernels::embedding(w, zeros({3})), "embedding", "indices", "f32", "i32 or i64");
  EXPECT_ERROR(kernels::embedding(zeros({5}), zeros({3}, DType::i64)), "embedding", "2-D", "[5]");
  EXPECT_ERROR(kernels::embedding(zeros({5, 3}, DType::i64), zeros({3}, DType::i64)), "embedding",
               "weight", "i64");
  EXPECT_ERROR(
      kernels::embedding_backward(zeros({3, 4}), zeros({3}, DType::i64), zeros({5, 3}), false),
      "embedding_backward", "[3, 4]", "[3]", "[5, 3]");
  EXPECT_ERROR(kernels::embedding_backward(zeros({1, 3}), from_vector<int64_t>({5}, {1}),
                                           zeros({5, 3}), false),
               "embedding_backward", "index 5", "[0, 5)");
  EXPECT_ERROR(kernels::embedding_backward(zeros({1, 3}), zeros({1}, DType::i64),
                                           zeros({5, 3}, DType::f64), false),
               "embedding_backward", "grad_weight", "f64");
}

// ---- cross_entropy --------------------------------------------------------------------------

TEST(CpuCrossEntropy, hand_computed_tiny_case_with_ignore_index) {
  // Row 0: logits [0, 0], target 0 -> log 2. Row 1: [log 3, 0], target 1 ->
  // log(3 + 1) - 0 = log 4. Row 2 is ignored.
  Tensor logits = from_vector<double>({0, 0, std::log(3.0), 0, 5, -5}, {3, 2});
  Tensor targets = from_vector<int64_t>({0, 1, -100}, {3});
  kernels::LossSum loss = kernels::cross_entropy(logits, targets);
  EXPECT_EQ(loss.sum.dim(), 0);
  EXPECT_EQ(loss.sum.dtype(), DType::f64);
  EXPECT_EQ(loss.count.dtype(), DType::i64);
  EXPECT_NEAR(loss.sum.item(), 3.0 * std::log(2.0), 1e-15);
  EXPECT_EQ(loss.count.item(), 2.0);
  // d/dlogits of 2 * loss_sum: 2 * (softmax - onehot); 0 for the ignored row.
  Tensor dx =
      kernels::cross_entropy_backward(logits, targets, -100, scalar_tensor(2.0, DType::f64));
  EXPECT_TRUE(all_close(dx, f64_tensor({-1, 1, 1.5, -1.5, 0, 0}, {3, 2})));
}

// sum over counted rows of logsumexp(x) - x[t], in f64.
double reference_ce(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t c,
                    int64_t ignore) {
  double s = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore) continue;
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < c; ++j)
      m = std::max(m, x[r * c + j]);
    for (int64_t j = 0; j < c; ++j)
      z += std::exp(x[r * c + j] - m);
    s += m + std::log(z) - x[r * c + t[r]];
  }
  return s;
}

TEST(CpuCrossEntropy, matches_f64_reference_in_every_dtype) {
  const std::vector<int64_t> t = {3, 0, 2, 2, 6, 5, 1};  // 2 is ignore_index: a valid class
  for (DType dt : kFloatTypes) {
    for (DType it : {DType::i32, DType::i64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(it));
      Tensor logits = test::random_normal({7, 9}, dt, Device::cpu(), 2.0);
      Tensor targets = from_vector<int64_t>(t, {7}, it);
      kernels::LossSum loss = kernels::cross_entropy(logits, targets, 2);
      EXPECT_EQ(loss.sum.dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
      EXPECT_EQ(loss.count.item(), 5.0);
      const double expected = reference_ce(values(logits), t, 9, 2);
      EXPECT_NEAR(loss.sum.item(), expected, 1e-5 * std::fabs(expected) + 1e-6);
    }
  }
}

TEST(CpuCrossEntropy, large_logits_are_stable) {
  Tensor logits = from_vector<float>({1000, 1001, 1002, -1000, 0, 1000}, {2, 3});
  Tensor targets = from_vector<int64_t>({2, 0}, {2});
  kernels::LossSum loss = kernels::cross_entropy(logits, targets);
  const double expected = reference_ce(values(logits), {2, 0}, 3, -100);
  EXPECT_TRUE(std::isfinite(loss.sum.item()));
  EXPECT_NEAR(loss.sum.item(), expected, 1e-4);
  Tensor dx = kernels::cross_entropy_backward(logits, targets, -100, scalar_tensor(1.0));
  for (double v : values(dx))
    EXPECT_TRUE(std::isfinite(v));
}

TEST(CpuCrossEntropy, backward_matches_finite_differences) {
  const std::vector<int64_t> t = {1, -1, 4, 0};
  Tensor logits = test::random_normal({4, 5}, DType::f64);
  Tensor targets = from_vector<int64_t>(t, {4});
  const double seed = 0.75;
  Tensor dx = kernels::cross_entropy_backward(logits, targets, -1, scalar_tensor(seed, DType::f64));
  std::vector<double> fd = numeric_gradient(values(logits), [&](const std::vector<double>& x) {
    return seed * reference_ce(x, t, 5, -1);
  });
  EXPECT_TRUE(all_close(dx, f64_tensor(fd, {4, 5}), 1e-6, 1e-8));
  // The ignored row is exactly 0.
  for (int j = 0; j < 5; ++j)
    EXPECT_EQ(values(dx)[5 + j], 0.0);
}

TEST(CpuCrossEntropy, backward_in_every_dtype_and_strided_logits) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor logits = test::random_normal({6, 4}, dt).transpose(0, 1);  // [4, 6] strided
    const std::vector<int64_t> t = {5, 0, -100, 3};
    Tensor targets = from_vector<int64_t>(t, {4}, DType::i32);
    Tensor dx = kernels::cross_entropy_backward(logits, targets, -100, scalar_tensor(1.5, dt));
    EXPECT_EQ(dx.dtype(), dt);
    std::vector<double> x = values(logits), r(x.size(), 0.0);
    for (int i = 0; i < 4; ++i) {
      if (t[i] == -100) continue;
      double m = -INFINITY, z = 0;
      for (int j = 0; j < 6; ++j)
        m = std::max(m, x[i * 6 + j]);
      for (int j = 0; j < 6; ++j)
        z += std::exp(x[i * 6 + j] - m);
      for (int j = 0; j < 6; ++j)
        r[i * 6 + j] = 1.5 * (std::exp(x[i * 6 + j] - m) / z - (j == t[i] ? 1.0 : 0.0));
    }
    EXPECT_TRUE(all_close(dx, f64_tensor(r, {4, 6})));
    kernels::LossSum loss = kernels::cross_entropy(logits, targets);
    EXPECT_NEAR(loss.sum.item(), reference_ce(x, t, 6, -100), 1e-4);
  }
}

TEST(CpuCrossEntropy, empty_batches_give_zero_sum_and_count) {
  kernels::LossSum loss = kernels::cross_entropy(zeros({0, 5}), zeros({0}, DType::i64));
  EXPECT_EQ(loss.sum.item(), 0.0);
  EXPECT_EQ(loss.count.item(), 0.0);
  // Every row ignored: sum 0, count 0, gradient 0.
  Tensor logits = test::random_normal({2, 3}, DType::f32);
  Tensor all_ignored = from_vector<int64_t>({-100, -100}, {2});
  loss = kernels::cross_entropy(logits, all_ignored);
  EXPECT_EQ(loss.sum.item(), 0.0);
  EXPECT_EQ(loss.count.item(), 0.0);
  EXPECT_EQ(kernels::cross_entropy_backward(logits, all_ignored, -100, scalar_tensor(1.0))
                .to_vector<float>(),
            std::vector<float>(6, 0.0f));
}

TEST(CpuCrossEntropy, bad_inputs_throw_naming_op_and_values) {
  Tensor logits = zeros({4, 5});
  EXPECT_ERROR(kernels::cross_entropy(logits, from_vector<int64_t>({0, 5, 1, 2}, {4})),
               "cross_entropy", "target 5", "out of range [0, 5)");
  EXPECT_ERROR(kernels::cross_entropy(logits, from_vector<int64_t>({0, -3, 1, 2}, {4}), -100),
               "cross_entropy", "target -3", "[0, 5)", "-100");
  EXPECT_ERROR(kernels::cross_entropy(logits, zeros({3}, DType::i64)), "cross_entropy",
               "targets of shape [3]", "[4, 5]");
  EXPECT_ERROR(kernels::cross_entropy(logits, zeros({4})), "cross_entropy", "targets", "f32");
  EXPECT_ERROR(kernels::cross_entropy(zeros({2, 4, 5}), zeros({2}, DType::i64)), "cross_entropy",
               "2-D", "[2, 4, 5]");
  EXPECT_ERROR(kernels::cross_entropy(zeros({4, 5}, DType::i64), zeros({4}, DType::i64)),
               "cross_entropy", "logits", "i64");
  EXPECT_ERROR(kernels::cross_entropy_backward(logits, zeros({4}, DType::i64), -100, zeros({2})),
               "cross_entropy_backward", "grad_sum", "[2]");
  EXPECT_ERROR(kernels::cross_entropy_backward(logits, from_vector<int64_t>({0, 9, 1, 2}, {4}),
                                               -100, scalar_tensor(1.0)),
               "cross_entropy_backward", "target 9", "[0, 5)");
}

// ---- layer_norm -----------------------------------------------------------------------------

struct LnRef {
  std::vector<double> y, mean, rstd;
};

// y = (x - mean) * rstd * w + b per row of D, biased variance, in f64.
LnRef reference_layer_norm(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& b, int64_t d, double eps) {
  LnRef r;
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  r.y.resize(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < d; ++j)
      mu += x[i * d + j];
    mu /= d;
    for (int64_t j = 0; j < d; ++j)
      var += (x[i * d + j] - mu) * (x[i * d + j] - mu);
    var /= d;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j)
      r.y[i * d + j] =
          (x[i * d + j] - mu) * rs * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
  }
  return r;
}

TEST(CpuLayerNorm, forward_matches_f64_formula_in_every_dtype) {
  const double eps = 1e-5;
  for (DType dt : kFloatTypes) {
    for (int params = 0; params < 3; ++params) {  // none, of x's dtype, f32
      const bool affine = params > 0;
      const DType pdt = params == 2 ? DType::f32 : dt;
      if (params == 2 && (dt == DType::f32 || dt == DType::f64)) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " params " << params);
      Tensor x = test::random_normal({2, 3, 8}, dt, Device::cpu(), 2.0);
      Tensor w = affine ? test::random_normal({8}, pdt) : Tensor();
      Tensor b = affine ? test::random_normal({8}, pdt) : Tensor();
      kernels::LayerNormOutput r = kernels::layer_norm(x, w, b, eps);
      LnRef ref = reference_layer_norm(values(x), affine ? values(w) : std::vector<double>{},
                                       affine ? values(b) : std::vector<double>{}, 8, eps);
      const DType stats = dt == DType::f64 ? DType::f64 : DType::f32;
      EXPECT_EQ(r.out.dtype(), dt);
      EXPECT_EQ(r.mean.dtype(), stats);
      EXPECT_EQ(r.rstd.dtype(), stats);
      EXPECT_EQ(r.mean.shape(), (Shape{2, 3}));
      EXPECT_TRUE(all_close(r.out, f64_tensor(ref.y, {2, 3, 8})));
      EXPECT_TRUE(all_close(r.mean, f64_tensor(ref.mean, {2, 3}), test::default_rtol(stats),
                            test::default_atol(stats)));
      EXPECT_TRUE(all_close(r.rstd, f64_tensor(ref.rstd, {2, 3}), test::default_rtol(stats),
                            test::default_atol(stats)));
    }
  }
}

TEST(CpuLayerNorm, strided_input_and_empty_rows) {
  Tensor x = test::random_normal({6, 4}, DType::f32).transpose(0, 1);  // [4, 6] strided
  kernels::LayerNormOutput r = kernels::layer_norm(x, Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(
      all_close(r.out, f64_tensor(reference_layer_norm(values(x), {}, {}, 6, 1e-5).y, {4, 6})));
  kernels::LayerNormOutput e = kernels::layer_norm(zeros({0, 6}), ones({6}), zeros({6}), 1e-5);
  EXPECT_EQ(e.out.shape(), (Shape{0, 6}));
  EXPECT_EQ(e.mean.shape(), (Shape{0}));
  // A 1-D input is one row; mean and rstd are 0-d.
  kernels::LayerNormOutput one =
      kernels::layer_norm(from_vector<float>({1, 3}, {2}), Tensor(), Tensor(), 0.0);
  EXPECT_EQ(one.mean.dim(), 0);
  EXPECT_EQ(one.out.to_vector<float>(), (std::vector<float>{-1, 1}));
  EXPECT_EQ(one.mean.item(), 2.0);
  EXPECT_EQ(one.rstd.item(), 1.0);
}

TEST(CpuLayerNorm, backward_matches_finite_differences) {
  const int64_t rows = 3, d = 5;
  const double eps = 1e-5;
  Tensor x = test::random_normal({rows, d}, DType::f64);
  Tensor w = test::random_normal({d}, DType::f64);
  Tensor b = test::random_normal({d}, DType::f64);
  Tensor dy = test::random_normal({rows, d}, DType::f64);
  kernels::LayerNormOutput r = kernels::layer_norm(x, w, b, eps);
  Tensor dw = empty({d}, DType::f64), db = empty({d}, DType::f64);
  test::poison(dw);
  test::poison(db);
  Tensor dx = kernels::layer_norm_backward(dy, x, w, r.mean, r.rstd, dw, db, false);
  const std::vector<double> vx = values(x), vw = values(w), vb = values(b), vdy = values(dy);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    const std::vector<double> y = reference_layer_norm(xx, ww, bb, d, eps).y;
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i)
      l += vdy[i] * y[i];
    return l;
  };
  const auto fdx = numeric_gradient(vx, [&](const auto& v) { return loss(v, vw, vb); });
  const auto fdw = numeric_gradient(vw, [&](const auto& v) { return loss(vx, v, vb); });
  const auto fdb = numeric_gradient(vb, [&](const auto& v) { return loss(vx, vw, v); });
  EXPECT_TRUE(all_close(dx, f64_tensor(fdx, {rows, d}), 1e-6, 1e-7));
  EXPECT_TRUE(all_close(dw, f64_tensor(fdw, {d}), 1e-6, 1e-7));
  EXPECT_TRUE(all_close(db, f64_tensor(fdb, {d}), 1e-6, 1e-7));
  // accumulate adds the same amounts again.
  kernels::layer_norm_backward(dy, x, w, r.mean, r.rstd, dw, db, true);
  EXPECT_TRUE(all_close(dw, kernels::binary_scalar(kernels::BinaryOp::Mul, f64_tensor(fdw, {d}), 2),
                        1e-6, 1e-7));
  EXPECT_TRUE(all_close(db, kernels::binary_scalar(kernels::BinaryOp::Mul, f64_tensor(fdb, {d}), 2),
                        1e-6, 1e-7));
  // Without weight the gradient is that of w = 1.
  Tensor ones_w = ones({d}, DType::f64);
  Tensor dx1 =
      kernels::layer_norm_backward(dy, x, Tensor(), r.mean, r.rstd, Tensor(), Tensor(), false);
  Tensor dx2 =
      kernels::layer_norm_backward(dy, x, ones_w, r.mean, r.rstd, Tensor(), Tensor(), false);
  EXPECT_TRUE(all_close(dx1, dx2));
}

// The standard formula in f64 on the stored inputs and statistics.
TEST(CpuLayerNorm, backward_in_every_dtype_with_f32_parameter_grads) {
  const int64_t rows = 4, d = 6;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = test::random_normal({rows, d}, dt);
    // fp32 master weights next to 16-bit activations.
    const bool half = dt == DType::bf16 || dt == DType::f16;
    Tensor w = test::random_normal({d}, half ? DType::f32 : dt);
    Tensor dy = test::random_normal({rows, d}, dt);
    kernels::LayerNormOutput r = kernels::layer_norm(x, w, Tensor(), 1e-5);
    Tensor dw = empty({d}, DType::f32), db = empty({d}, DType::f32);
    Tensor dx = kernels::layer_norm_backward(dy, x, w, r.mean, r.rstd, dw, db, false);
    const std::vector<double> vx = values(x), vw = values(w), vdy = values(dy);
    const std::vector<double> mu = values(r.mean), rs = values(r.rstd);
    std::vector<double> edx(vx.size()), edw(d, 0.0), edb(d, 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < d; ++j) {
        const double xh = (vx[i * d + j] - mu[i]) * rs[i];
        const double g = vdy[i * d + j] * vw[j];
        s1 += g;
        s2 += g * xh;
        edw[j] += vdy[i * d + j] * xh;
        edb[j] += vdy[i * d + j];
      }
      for (int64_t j = 0; j < d; ++j) {
        const double xh = (vx[i * d + j] - mu[i]) * rs[i];
        edx[i * d + j] = rs[i] * (vdy[i * d + j] * vw[j] - s1 / d - xh * s2 / d);
      }
    }
    EXPECT_TRUE(all_close(dx, f64_tensor(edx, {rows, d}), test::default_rtol(dt),
                          test::default_atol(dt) * 4));
    EXPECT_TRUE(all_close(dw, f64_tensor(edw, {d}), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(db, f64_tensor(edb, {d}), 1e-5, 1e-5));
  }
}

TEST(CpuLayerNorm, backward_with_no_rows_writes_zero_parameter_grads) {
  Tensor dw = full({3}, 7.0), db = full({3}, 7.0);
  Tensor dx = kernels::layer_norm_backward(zeros({0, 3}), zeros({0, 3}), ones({3}), zeros({0}),
                                           zeros({0}), dw, db, true);
  EXPECT_EQ(dx.shape(), (Shape{0, 3}));
  EXPECT_EQ(dw.to_vector<float>(), std::vector<float>(3, 7.0f));
  kernels::layer_norm_backward(zeros({0, 3}), zeros({0, 3}), ones({3}), zeros({0}), zeros({0}), dw,
                               db, false);
  EXPECT_EQ(dw.to_vector<float>(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(db.to_vector<float>(), std::vector<float>(3, 0.0f));
}

// The two halves the weight-gradient branch runs apart (Note [Weight gradients
// on a branch]): dx and the partial sums, then the totals, give the bits of
// the whole backward, writing and adding; no rows give zeros; bad totals throw.
TEST(CpuLayerNorm, backward_in_two_halves_equals_the_whole_and_refuses_bad_totals) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({9, 12}, dt, Device::cpu(), 2.0);
    const Tensor w = test::random_normal({12}, dt);
    const Tensor dy = test::random_normal({9, 12}, dt);
    const kernels::LayerNormOutput r = kernels::layer_norm(x, w, Tensor(), 1e-5);
    const DType gd = dt == DType::f64 ? DType::f64 : DType::f32;
    for (bool accumulate : {false, true}) {
      Tensor dw = test::random_normal({12}, gd), db = test::random_normal({12}, gd);
      Tensor dw2 = dw.clone(), db2 = db.clone();
      const Tensor dx = kernels::layer_norm_backward(dy, x, w, r.mean, r.rstd, dw, db, accumulate);
      kernels::NormPartials p;
      const Tensor dx2 =
          kernels::layer_norm_backward_partials(dy, x, w, r.mean, r.rstd, true, true, &p);
      kernels::norm_param_totals(p, dw2, db2, accumulate);
      EXPECT_TRUE(test::all_equal(dx2, dx));
      EXPECT_TRUE(test::all_equal(dw2, dw));
      EXPECT_TRUE(test::all_equal(db2, db));
    }
  }
  kernels::NormPartials none;
  kernels::layer_norm_backward_partials(zeros({0, 3}), zeros({0, 3}), ones({3}), zeros({0}),
                                        zeros({0}), true, true, &none);
  Tensor dw = full({3}, 7.0);
  kernels::norm_param_totals(none, dw, Tensor(), false);
  EXPECT_EQ(dw.to_vector<float>(), std::vector<float>(3, 0.0f));

  const Tensor x = test::random_normal({2, 3});
  const kernels::LayerNormOutput r = kernels::layer_norm(x, Tensor(), Tensor(), 1e-5);
  EXPECT_ERROR(
      kernels::layer_norm_backward_partials(x, x, Tensor(), r.mean, r.rstd, true, true, nullptr),
      "layer_norm_backward", "no NormPartials");
  kernels::NormPartials only_bias;
  kernels::layer_norm_backward_partials(x, x, Tensor(), r.mean, r.rstd, false, true, &only_bias);
  EXPECT_ERROR(kernels::norm_param_totals(only_bias, zeros({3}), Tensor(), false),
               "norm_param_totals", "dweight was not wanted");
  EXPECT_ERROR(kernels::norm_param_totals(only_bias, Tensor(), zeros({2}), false),
               "norm_param_totals", "dbias", "[2]", "the partial sums", "[3]");
  EXPECT_ERROR(kernels::norm_param_totals(only_bias, Tensor(), zeros({3}, DType::f64), false),
               "norm_param_totals", "dbias", "f64");
}

// Note [Fan-out sums in the backward]: dx_add is added to dx before its one
// rounding; in f64 that is dx + dx_add to the last bits, in 16 bits it is at
// most one rounding away from the sum of the two rounded halves.
TEST(CpuLayerNorm, backward_adds_dx_add_before_rounding_and_refuses_bad_ones) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({9, 12}, dt, Device::cpu(), 2.0);
    const Tensor w = test::random_normal({12}, dt);
    const Tensor dy = test::random_normal({9, 12}, dt);
    const Tensor add = test::random_normal({9, 12}, dt);
    const kernels::LayerNormOutput r = kernels::layer_norm(x, w, Tensor(), 1e-5);
    kernels::NormPartials p, p_add;
    const Tensor dx =
        kernels::layer_norm_backward_partials(dy, x, w, r.mean, r.rstd, true, true, &p);
    const Tensor dx_add =
        kernels::layer_norm_backward_partials(dy, x, w, r.mean, r.rstd, true, true, &p_add, add);
    const Tensor sum =
        kernels::binary(kernels::BinaryOp::Add, dx.to(DType::f64), add.to(DType::f64)).to(dt);
    EXPECT_TRUE(
        test::close(dx_add, sum, dt == DType::f64 ? 1e-14 : test::normalized_tolerance(dt)));
    EXPECT_FALSE(test::all_equal(dx_add, dx));
    // The parameters' partial sums do not see dx_add.
    EXPECT_TRUE(test::all_equal(p_add.dweight, p.dweight));
    EXPECT_TRUE(test::all_equal(p_add.dbias, p.dbias));
  }
  const Tensor x = test::random_normal({2, 3});
  const kernels::LayerNormOutput r = kernels::layer_norm(x, Tensor(), Tensor(), 1e-5);
  kernels::NormPartials p;
  EXPECT_ERROR(kernels::layer_norm_backward_partials(x, x, Tensor(), r.mean, r.rstd, true, true, &p,
                                                     zeros({3, 2})),
               "layer_norm_backward", "dx_add", "[3, 2]", "[2, 3]");
  EXPECT_ERROR(kernels::layer_norm_backward_partials(x, x, Tensor(), r.mean, r.rstd, true, true, &p,
                                                     zeros({2, 3}, DType::bf16)),
               "layer_norm_backward", "bf16", "f32");
}

TEST(CpuLayerNorm, bad_inputs_throw_naming_op_and_shapes) {
  Tensor x = zeros({2, 3});
  EXPECT_ERROR(kernels::layer_norm(x, zeros({4}), Tensor(), 1e-5), "layer_norm", "weight", "[4]",
               "[2, 3]");
  EXPECT_ERROR(kernels::layer_norm(x, Tensor(), zeros({3, 1}), 1e-5), "layer_norm", "bias",
               "[3, 1]");
  EXPECT_ERROR(kernels::layer_norm(x, zeros({3}, DType::f64), Tensor(), 1e-5), "layer_norm",
               "weight", "f64", "[3]");
  EXPECT_ERROR(kernels::layer_norm(x.to(DType::bf16), Tensor(), zeros({3}, DType::f16), 1e-5),
               "layer_norm", "bias", "f16", "bf16 or f32");
  EXPECT_ERROR(kernels::layer_norm(x, Tensor(), Tensor(), -1.0), "layer_norm", "eps");
  EXPECT_ERROR(kernels::layer_norm(scalar_tensor(1.0), Tensor(), Tensor(), 1e-5), "layer_norm",
               "[]");
  EXPECT_ERROR(kernels::layer_norm(zeros({2, 0}), Tensor(), Tensor(), 1e-5), "layer_norm",
               "[2, 0]");
  EXPECT_ERROR(kernels::layer_norm(zeros({2, 3}, DType::i32), Tensor(), Tensor(), 1e-5),
               "layer_norm", "i32");
  kernels::LayerNormOutput r = kernels::layer_norm(x, Tensor(), Tensor(), 1e-5);
  EXPECT_ERROR(kernels::layer_norm_backward(zeros({3, 2}), x, Tensor(), r.mean, r.rstd, Tensor(),
                                            Tensor(), false),
               "layer_norm_backward", "[3, 2]", "[2, 3]");
  EXPECT_ERROR(kernels::layer_norm_backward(x, x, Tensor(), r.mean.to(DType::f64), r.rstd, Tensor(),
                                            Tensor(), false),
               "layer_norm_backward", "mean", "f64", "[2, 3]");
  EXPECT_ERROR(
      kernels::layer_norm_backward(x, x, Tensor(), zeros({3}), r.rstd, Tensor(), Tensor(), false),
      "layer_norm_backward", "mean", "[3]");
  EXPECT_ERROR(
      kernels::layer_norm_backward(x, x, Tensor(), r.mean, r.rstd, zeros({2}), Tensor(), false),
      "layer_norm_backward", "dweight", "[2]");
  EXPECT_ERROR(kernels::layer_norm_backward(x, x, Tensor(), r.mean, r.rstd, Tensor(),
                                            zeros({3}, DType::f64), false),
               "layer_norm_backward", "dbias", "f64");
}

TEST(CpuIndices, check_switch_defaults_on) {
  EXPECT_TRUE(kernels::check_indices());
  kernels::set_check_indices(false);
  EXPECT_FALSE(kernels::check_indices());
  // The CPU checks whatever the switch says.
  EXPECT_ERROR(kernels::embedding(zeros({2, 2}), from_vector<int64_t>({2}, {1})), "embedding",
               "index 2");
  kernels::set_check_indices(true);
}

}  // namespace
}  // namespace accrue
