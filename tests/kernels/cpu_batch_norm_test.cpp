// The CPU reference of the fused batch normalization (kernels/batch_norm.h,
// Note [Fused batch norm kernels]) against the formula written out in f64
// elementwise ops, in both layouts; the statistics merge against Chan's
// formula; channels-last elementwise results (Note [Channels-last results]);
// bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "accrue/kernels/batch_norm.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::BinaryOp;

bool is_channels_last(const Tensor& t) {
  return !t.is_contiguous() && t.stride(1) == 1 && t.stride(3) == t.size(1);
}

Tensor per_channel(const Tensor& v, int64_t dims) {
  Shape s(static_cast<size_t>(dims), 1);
  s[1] = v.numel();
  return v.reshape(s);
}

// Mean over every dim but 1, kept as [1, C, 1, ...].
Tensor channel_mean(const Tensor& t) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < t.dim(); ++d)
    dims.push_back(d);
  return kernels::mean(t, dims, /*keepdim=*/true);
}

TEST(CpuBatchNorm, forward_and_backward_match_the_formula_in_f64) {
  for (const Shape& shape : {Shape{6, 5, 4, 3}, Shape{7, 3}, Shape{4, 6, 9}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t c = shape[1];
    const Tensor x = kernels::binary_scalar(
        BinaryOp::Add, test::random_normal(shape, DType::f64, Device::cpu(), 3.0), 40.0);
    const Tensor w = test::random_normal({c}, DType::f64), b = test::random_normal({c}, DType::f64);
    const kernels::BatchNormForward f = kernels::batch_norm_forward(x, w, b, 1e-5);
    const Tensor mean = channel_mean(x);
    const Tensor centered = kernels::binary(BinaryOp::Sub, x, mean);
    const Tensor var = channel_mean(kernels::binary(BinaryOp::Mul, centered, centered));
    const Tensor invstd = kernels::binary_scalar(
        BinaryOp::Div,
        kernels::unary(kernels::UnaryOp::Sqrt, kernels::binary_scalar(BinaryOp::Add, var, 1e-5)),
        1.0, /*scalar_first=*/true);
    const Tensor xhat = kernels::binary(BinaryOp::Mul, centered, invstd);
    const Tensor y = kernels::binary(BinaryOp::Add,
                                     kernels::binary(BinaryOp::Mul, xhat, per_channel(w, x.dim())),
                                     per_channel(b, x.dim()));
    EXPECT_TRUE(test::close(f.out, y, 1e-13));
    EXPECT_TRUE(test::close(f.mean, mean.reshape({c}), 1e-14));
    EXPECT_TRUE(test::close(f.var, var.reshape({c}), 1e-13));
    EXPECT_TRUE(test::close(f.invstd, invstd.reshape({c}), 1e-13));

    const Tensor g = test::random_normal(shape, DType::f64);
    const kernels::BatchNormBackward bw =
        kernels::batch_norm_backward(g, x, w, f.mean, f.invstd, /*need_dx=*/true);
    const Tensor g_xhat = kernels::binary(BinaryOp::Mul, g, xhat);
    EXPECT_TRUE(test::close(
        bw.dbias,
        kernels::binary_scalar(BinaryOp::Mul, channel_mean(g), static_cast<double>(x.numel() / c))
            .reshape({c}),
        1e-12));
    EXPECT_TRUE(test::close(bw.dweight,
                            kernels::binary_scalar(BinaryOp::Mul, channel_mean(g_xhat),
                                                   static_cast<double>(x.numel() / c))
                                .reshape({c}),
                            1e-12));
    // dx = invstd w (g - mean(g) - xhat mean(g xhat))
    const Tensor dx = kernels::binary(
        BinaryOp::Mul,
        kernels::binary(BinaryOp::Sub, kernels::binary(BinaryOp::Sub, g, channel_mean(g)),
                        kernels::binary(BinaryOp::Mul, xhat, channel_mean(g_xhat))),
        kernels::binary(BinaryOp::Mul, invstd, per_channel(w, x.dim())));
    EXPECT_TRUE(test::close(bw.dx, dx, 1e-11));
    EXPECT_FALSE(
        kernels::batch_norm_backward(g, x, w, f.mean, f.invstd, /*need_dx=*/false).dx.defined());
  }
}

TEST(CpuBatchNorm, a_channels_last_input_gives_channels_last_results_with_the_same_values) {
  const Tensor x = test::random_normal({3, 8, 5, 4}, DType::f32);
  const Tensor w = test::random_normal({8}), b = test::random_normal({8});
  const Tensor xl = test::as_channels_last(x);
  const kernels::BatchNormForward plain = kernels::batch_norm_forward(x, w, b, 1e-5);
  const kernels::BatchNormForward last = kernels::batch_norm_forward(xl, w, b, 1e-5);
  EXPECT_TRUE(is_channels_last(last.out));
  EXPECT_TRUE(plain.out.is_contiguous());
  EXPECT_TRUE(test::all_equal(last.out, plain.out));
  EXPECT_TRUE(test::all_equal(last.mean, plain.mean));
  // A contiguous grad next to a channels-last input is taken into x's layout.
  const Tensor g = test::random_normal(x.shape());
  const kernels::BatchNormBackward bp =
      kernels::batch_norm_backward(g, x, w, plain.mean, plain.invstd, true);
  const kernels::BatchNormBackward bl =
      kernels::batch_norm_backward(g, xl, w, last.mean, last.invstd, true);
  EXPECT_TRUE(is_channels_last(bl.dx));
  EXPECT_TRUE(test::all_equal(bl.dx, bp.dx));
  EXPECT_TRUE(test::all_equal(bl.dweight, bp.dweight));
  EXPECT_TRUE(test::all_equal(bl.dbias, bp.dbias));
}

TEST(CpuBatchNorm, sixteen_bit_inputs_keep_f32_statistics) {
  // Channels centred far from zero: statistics in bf16 would lose the variance.
  const Tensor x64 = kernels::binary_scalar(
      BinaryOp::Add, test::random_normal({16, 4, 6, 6}, DType::f64, Device::cpu(), 3.0), 100.0);
  const Tensor x = x64.to(DType::bf16);
  const Tensor w = full({4}, 1.0, DType::bf16), b = zeros({4}, DType::bf16);
  const kernels::BatchNormForward f = kernels::batch_norm_forward(x, w, b, 1e-5);
  EXPECT_EQ(f.mean.dtype(), DType::f32);
  EXPECT_EQ(f.out.dtype(), DType::bf16);
  const kernels::BatchNormForward exact =
      kernels::batch_norm_forward(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64), 1e-5);
  EXPECT_TRUE(test::close(f.var, exact.var, 1e-6));
  EXPECT_TRUE(test::close(f.out, exact.out, 1e-2));
}

TEST(CpuBatchNorm, merging_statistics_is_chans_formula) {
  const int64_t c = 5;
  Tensor count = full({1}, 12.0, DType::f64);
  Tensor mean = test::random_normal({c}, DType::f64),
         m2 = test::random_uniform({c}, 1, 4, DType::f64);
  const Tensor mean0 = mean.clone(), m20 = m2.clone();
  const Tensor bm = test::random_normal({c}, DType::f32), bv = test::random_uniform({c}, 0.5, 2);
  kernels::batch_norm_merge_statistics(count, mean, m2, bm, bv, 7.0);
  const double na = 12.0, nb = 7.0, total = 19.0;
  for (int64_t i = 0; i < c; ++i) {
    const double m0 = mean0.data<double>()[i], b = static_cast<double>(bm.data<float>()[i]);
    const double delta = b - m0;
    EXPECT_DOUBLE_EQ(mean.data<double>()[i], m0 + delta * nb / total);
    EXPECT_DOUBLE_EQ(m2.data<double>()[i], m20.data<double>()[i] +
                                               static_cast<double>(bv.data<float>()[i]) * nb +
                                               delta * delta * na * nb / total);
  }
  EXPECT_EQ(count.data<double>()[0], 19.0);
}

TEST(CpuBatchNorm, adopting_statistics_moves_the_running_ones_and_restarts_the_window) {
  const int64_t c = 4;
  const Tensor rm = test::random_normal({c}, DType::f64),
               rv = test::random_uniform({c}, 1, 2, DType::f64);
  const Tensor rm0 = rm.clone(), rv0 = rv.clone();
  Tensor count = full({1}, 9.0, DType::f64);
  Tensor mean = test::random_normal({c}, DType::f64),
         m2 = test::random_uniform({c}, 1, 5, DType::f64);
  const Tensor mean0 = mean.clone(), m20 = m2.clone();
  kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 0.1);
  for (int64_t i = 0; i < c; ++i) {
    EXPECT_DOUBLE_EQ(rm.data<double>()[i],
                     rm0.data<double>()[i] * 0.9 + mean0.data<double>()[i] * 0.1);
    EXPECT_DOUBLE_EQ(rv.data<double>()[i],
                     rv0.data<double>()[i] * 0.9 + m20.data<double>()[i] / 8.0 * 0.1);
  }
  EXPECT_TRUE(test::all_equal(mean, zeros({c}, DType::f64)));
  EXPECT_TRUE(test::all_equal(m2, zeros({c}, DType::f64)));
  EXPECT_EQ(count.data<double>()[0], 0.0);
  // count 0: nothing to adopt, the running statistics stay.
  const Tensor rm1 = rm.clone();
  kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 0.1);
  EXPECT_TRUE(test::all_equal(rm, rm1));
  // Momentum 1 replaces outright, mending a non-finite running value.
  rm.fill_(std::numeric_limits<double>::quiet_NaN());
  count.fill_(3.0);
  mean.fill_(2.5);
  kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 1.0);
  EXPECT_TRUE(test::all_equal(rm, full({c}, 2.5, DType::f64)));
  // Note [Non-finite window statistics]: one NaN mean or infinite M2 and no
  // channel moves; the window is still restarted.
  for (int bad = 0; bad < 2; ++bad) {
    const Tensor rm2 = rm.clone(), rv2 = rv.clone();
    count.fill_(5.0);
    mean.copy_(test::random_normal({c}, DType::f64));
    m2.copy_(test::random_uniform({c}, 1, 5, DType::f64));
    (bad == 0 ? mean : m2).data<double>()[c - 1] = bad == 0
                                                       ? std::numeric_limits<double>::quiet_NaN()
                                                       : std::numeric_limits<double>::infinity();
    kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 0.1);
    EXPECT_TRUE(test::all_equal(rm, rm2));
    EXPECT_TRUE(test::all_equal(rv, rv2));
    EXPECT_TRUE(test::all_equal(mean, zeros({c}, DType::f64)));
    EXPECT_TRUE(test::all_equal(m2, zeros({c}, DType::f64)));
    EXPECT_EQ(count.data<double>()[0], 0.0);
  }
  EXPECT_ERROR(kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 0.0),
               "batch_norm_adopt_statistics", "momentum = 0");
  EXPECT_ERROR(kernels::batch_norm_adopt_statistics(rm.to(DType::f32), rv, count, mean, m2, 0.1),
               "batch_norm_adopt_statistics", "running_mean is f32");
}

TEST(CpuBatchNorm, bad_inputs_throw_naming_the_op_and_values) {
  const Tensor x = test::random_normal({4, 3, 2, 2});
  const Tensor w = test::random_normal({3}), b = test::random_normal({3});
  EXPECT_ERROR(kernels::batch_norm_forward(x, test::random_normal({4}), b, 1e-5), "batch_norm",
               "weight has shape [4]", "expected [3]");
  EXPECT_ERROR(kernels::batch_norm_forward(x, w, b.to(DType::f64), 1e-5), "bias is f64");
  EXPECT_ERROR(kernels::batch_norm_forward(x, w, b, 0.0), "eps = 0");
  EXPECT_ERROR(kernels::batch_norm_forward(test::random_normal({1, 3}), w, b, 1e-5),
               "more than one value per channel, got 1");
  EXPECT_ERROR(kernels::batch_norm_forward(test::random_normal({4}), w, b, 1e-5),
               "input has shape [4]");
  const kernels::BatchNormForward f = kernels::batch_norm_forward(x, w, b, 1e-5);
  EXPECT_ERROR(
      kernels::batch_norm_backward(test::random_normal({4, 3, 2, 1}), x, w, f.mean, f.invstd, true),
      "batch_norm_backward", "grad is f32 [4, 3, 2, 1]", "[4, 3, 2, 2]");
  EXPECT_ERROR(kernels::batch_norm_backward(x, x, w, f.mean.to(DType::f64), f.invstd, true),
               "batch_norm_backward", "mean is f64");
  Tensor count = zeros({1}, DType::f64), mean = zeros({3}, DType::f64), m2 = zeros({3}, DType::f64);
  EXPECT_ERROR(kernels::batch_norm_merge_statistics(count, mean, m2, f.mean, f.var, 0.0),
               "batch_norm_merge_statistics", "batch_count = 0");
  EXPECT_ERROR(kernels::batch_norm_merge_statistics(zeros({1}), mean, m2, f.mean, f.var, 4.0),
               "count is f32");
}

// ---- Note [Channels-last results] ----------------------------------------------------

TEST(CpuChannelsLast, elementwise_results_keep_a_channels_last_layout) {
  const Tensor a = test::random_normal({2, 6, 3, 5}), c = test::random_normal({2, 6, 3, 5});
  const Tensor al = test::as_channels_last(a), cl = test::as_channels_last(c);
  const Tensor bias = test::random_normal({1, 6, 1, 1});
  struct Case {
    const char* what;
    Tensor plain, last;
  };
  const Case cases[] = {
      {"relu", kernels::unary(kernels::UnaryOp::Relu, a),
       kernels::unary(kernels::UnaryOp::Relu, al)},
      {"add of two", kernels::binary(BinaryOp::Add, a, c), kernels::binary(BinaryOp::Add, al, cl)},
      {"add of mixed layouts", kernels::binary(BinaryOp::Add, a, c),
       kernels::binary(BinaryOp::Add, al, c)},
      {"broadcast bias", kernels::binary(BinaryOp::Mul, a, bias),
       kernels::binary(BinaryOp::Mul, al, bias)},
      {"scalar", kernels::binary_scalar(BinaryOp::Mul, a, 3.0, false),
       kernels::binary_scalar(BinaryOp::Mul, al, 3.0, false)},
      {"relu backward", kernels::unary_backward(kernels::UnaryOp::Relu, c, a, Tensor(), 0.0),
       kernels::unary_backward(kernels::UnaryOp::Relu, cl, al, Tensor(), 0.0)},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    EXPECT_TRUE(k.plain.is_contiguous());
    EXPECT_TRUE(is_channels_last(k.last));
    EXPECT_TRUE(test::all_equal(k.last, k.plain));
  }
  // Broadcast operands alone, or a layout that is both (C = 1), stay contiguous.
  EXPECT_TRUE(
      kernels::binary(BinaryOp::Add, bias, a.narrow(1, 0, 1).contiguous().expand({2, 6, 3, 5}))
          .is_contiguous());
  const Tensor one = test::as_channels_last(test::random_normal({2, 1, 3, 5}));
  EXPECT_TRUE(kernels::unary(kernels::UnaryOp::Relu, one).is_contiguous());
}

}  // namespace
}  // namespace accrue
