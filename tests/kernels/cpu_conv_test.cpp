// conv2d and pooling on the CPU (kernels/conv.h): hand-computed cases, exact
// identities between options (stride, padding, dilation, groups), the beta of
// the weight gradient, the 16-bit dtypes, and every bad input.
#include <cmath>
#include <limits>

#include "accrue/kernels/conv.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::Conv2dOptions;
using kernels::Pool2dOptions;

Tensor f64_values(const std::vector<double>& v, const Shape& shape) {
  return from_vector<double>(v, shape);
}

TEST(CpuConv, a_hand_computed_convolution) {
  // x = 1..9 in a 3 x 3 plane, weight [[1, 0], [0, -1]]: x[i][j] - x[i+1][j+1] = -4.
  const Tensor x = f64_values({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Tensor w = f64_values({1, 0, 0, -1}, {1, 1, 2, 2});
  EXPECT_TRUE(test::all_equal(kernels::conv2d(x, w, {}), full({1, 1, 2, 2}, -4.0, DType::f64)));
  // Padding 1: the corners see one tap each, e.g. out[0][0] = -x[0][0] = -1.
  Conv2dOptions pad;
  pad.pad_h = pad.pad_w = 1;
  const Tensor padded = kernels::conv2d(x, w, pad);
  EXPECT_EQ(padded.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(padded.to_vector<double>()[0], -1.0);
  EXPECT_EQ(padded.to_vector<double>()[15], 9.0);
}

TEST(CpuConv, stride_padding_and_dilation_are_exact_identities) {
  const Tensor x = test::random_normal({2, 3, 9, 8}, DType::f64);
  const Tensor w = test::random_normal({4, 3, 3, 2}, DType::f64);
  const Tensor full_res = kernels::conv2d(x, w, {});
  // Stride 2 keeps every other output of stride 1.
  Conv2dOptions s2;
  s2.stride_h = s2.stride_w = 2;
  const Tensor strided = kernels::conv2d(x, w, s2);
  const std::vector<double> a = strided.to_vector<double>(), b = full_res.to_vector<double>();
  const int64_t oh = full_res.size(2), ow = full_res.size(3);
  for (int64_t p = 0; p < 2 * 4; ++p)
    for (int64_t i = 0; i < strided.size(2); ++i)
      for (int64_t j = 0; j < strided.size(3); ++j)
        EXPECT_EQ(a[static_cast<size_t>((p * strided.size(2) + i) * strided.size(3) + j)],
                  b[static_cast<size_t>((p * oh + 2 * i) * ow + 2 * j)]);
  // Padding p equals convolving the input padded with zeros.
  Conv2dOptions p1;
  p1.pad_h = 2;
  p1.pad_w = 1;
  Tensor xp = zeros({2, 3, 13, 10}, DType::f64);
  xp.narrow(2, 2, 9).narrow(3, 1, 8).copy_(x);
  EXPECT_TRUE(test::all_equal(kernels::conv2d(x, w, p1), kernels::conv2d(xp, w, {})));
  // Dilation 2 equals the kernel with zeros between its taps.
  Conv2dOptions d2;
  d2.dilation_h = d2.dilation_w = 2;
  Tensor wd = zeros({4, 3, 5, 3}, DType::f64);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j)
      wd.narrow(2, 2 * i, 1).narrow(3, 2 * j, 1).copy_(w.narrow(2, i, 1).narrow(3, j, 1));
  EXPECT_TRUE(test::all_equal(kernels::conv2d(x, w, d2), kernels::conv2d(x, wd, {})));
}

TEST(CpuConv, groups_are_separate_convolutions_and_1x1_is_a_matmul) {
  const Tensor x = test::random_normal({2, 4, 5, 5}, DType::f64);
  const Tensor w = test::random_normal({6, 2, 3, 3}, DType::f64);
  Conv2dOptions g2;
  g2.groups = 2;
  const Tensor grouped = kernels::conv2d(x, w, g2);
  for (int64_t g = 0; g < 2; ++g) {
    const Tensor part =
        kernels::conv2d(x.narrow(1, 2 * g, 2).contiguous(), w.narrow(0, 3 * g, 3).contiguous(), {});
    EXPECT_TRUE(test::all_equal(grouped.narrow(1, 3 * g, 3).contiguous(), part)) << "group " << g;
  }
  // A 1 x 1 kernel mixes channels only: out[n, :, p] = W x[n, :, p].
  const Tensor w1 = test::random_normal({3, 4, 1, 1}, DType::f64);
  const Tensor conv = kernels::conv2d(x, w1, {});
  const Tensor mm = kernels::matmul(w1.reshape({3, 4}), x.narrow(0, 1, 1).reshape({4, 25}));
  EXPECT_LE(test::relative_error(conv.narrow(0, 1, 1).reshape({3, 25}).contiguous(), mm), 1e-15);
}

// Channels-last (NHWC) memory is an NCHW-shaped view with permuted strides:
// the same values give the same bits, whatever the layout.
TEST(CpuConv, channels_last_inputs_give_the_same_result) {
  const Tensor nhwc = test::random_normal({2, 5, 4, 3}, DType::f64);  // [N, H, W, C] in memory
  const Tensor x = nhwc.permute({0, 3, 1, 2});                        // logical [N, C, H, W]
  ASSERT_FALSE(x.is_contiguous());
  const Tensor w = test::random_normal({4, 3, 3, 3}, DType::f64);
  Conv2dOptions o;
  o.pad_h = o.pad_w = 1;
  EXPECT_TRUE(test::all_equal(kernels::conv2d(x, w, o), kernels::conv2d(x.contiguous(), w, o)));
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  EXPECT_TRUE(
      test::all_equal(kernels::max_pool2d(x, p).out, kernels::max_pool2d(x.contiguous(), p).out));
}

TEST(CpuConv, the_weight_gradient_writes_with_beta_0_and_adds_with_beta_1) {
  const Tensor x = test::random_normal({2, 3, 6, 6}, DType::f64);
  const Tensor g = test::random_normal({2, 4, 4, 4}, DType::f64);
  Tensor dw = full({4, 3, 3, 3}, std::numeric_limits<double>::quiet_NaN(), DType::f64);
  kernels::conv2d_backward_weight(g, x, dw, {}, 0.0);  // never reads the NaN
  const Tensor once = dw.clone();
  EXPECT_TRUE(std::isfinite(once.to_vector<double>()[0]));
  kernels::conv2d_backward_weight(g, x, dw, {}, 1.0);
  EXPECT_LE(test::relative_error(dw, kernels::binary_scalar(kernels::BinaryOp::Mul, once, 2.0)),
            1e-15);
  // Into an f32 slot from bf16 operands: the double result, rounded once.
  Tensor slot = zeros({4, 3, 3, 3}, DType::f32);
  kernels::conv2d_backward_weight(g.to(DType::bf16), x.to(DType::bf16), slot, {}, 0.0);
  Tensor expected = zeros({4, 3, 3, 3}, DType::f64);
  kernels::conv2d_backward_weight(g.to(DType::bf16).to(DType::f64),
                                  x.to(DType::bf16).to(DType::f64), expected, {}, 0.0);
  EXPECT_TRUE(test::all_equal(slot, expected.to(DType::f32)));
}

TEST(CpuConv, sixteen_bit_dtypes_round_the_double_result_once) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({1, 2, 5, 5}, dt);
    const Tensor w = test::random_normal({3, 2, 3, 3}, dt);
    const Tensor out = kernels::conv2d(x, w, {});
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_TRUE(
        test::all_equal(out, kernels::conv2d(x.to(DType::f64), w.to(DType::f64), {}).to(dt)));
  }
}

TEST(CpuPool, max_pool_picks_the_first_maximum_and_keeps_nan) {
  const Tensor x = f64_values({1, 5, 5, 2, 0, 3, 7, 1, 4, 9, 9, 2, 3, 8, 0, 6}, {1, 1, 4, 4});
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  const kernels::MaxPoolOutput r = kernels::max_pool2d(x, p);
  EXPECT_EQ(r.out.to_vector<double>(), (std::vector<double>{5, 7, 9, 9}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 6, 9, 10}));
  // The gradient goes to the argmax only.
  const Tensor dx =
      kernels::max_pool2d_backward(f64_values({1, 2, 3, 4}, {1, 1, 2, 2}), r.indices, x.shape(), p);
  EXPECT_EQ(dx.to_vector<double>(),
            (std::vector<double>{0, 1, 0, 0, 0, 0, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0}));
  Tensor xn = x.clone();
  xn.narrow(3, 0, 1).narrow(2, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(kernels::max_pool2d(xn, p).out.to_vector<double>()[0]));
}

TEST(CpuPool, average_pools_count_the_padding_as_pytorch_does) {
  const Tensor x = full({1, 1, 3, 3}, 1.0, DType::f64);
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 1;
  p.pad_h = p.pad_w = 1;
  // The corner window holds 4 ones among 9 cells: 4/9 counting padding, 1 without.
  EXPECT_DOUBLE_EQ(kernels::avg_pool2d(x, p).to_vector<double>()[0], 4.0 / 9.0);
  p.count_include_pad = false;
  EXPECT_DOUBLE_EQ(kernels::avg_pool2d(x, p).to_vector<double>()[0], 1.0);
  // Adaptive to 1 x 1 is the plane's mean; to a divisor size it is avg_pool2d.
  const Tensor r = test::random_normal({2, 3, 6, 4}, DType::f64);
  const Tensor mean = kernels::adaptive_avg_pool2d(r, 1, 1);
  EXPECT_NEAR(mean.to_vector<double>()[0],
              kernels::sum(r.narrow(0, 0, 1).narrow(1, 0, 1)).item() / 24.0, 1e-15);
  Pool2dOptions q;
  q.kernel_h = 3;
  q.kernel_w = 2;
  q.stride_h = 3;
  q.stride_w = 2;
  EXPECT_LE(test::relative_error(kernels::adaptive_avg_pool2d(r, 2, 2), kernels::avg_pool2d(r, q)),
            1e-15);
}

TEST(CpuConv, bad_inputs_are_errors_naming_the_op_and_shapes) {
  const Tensor x = test::random_normal({1, 4, 5, 5}, DType::f64);
  const Tensor w = test::random_normal({2, 4, 3, 3}, DType::f64);
  EXPECT_ERROR(kernels::conv2d(x.reshape({4, 5, 5}), w, {}), "conv2d", "[4, 5, 5]", "4 dims");
  EXPECT_ERROR(kernels::conv2d(x, test::random_normal({2, 3, 3, 3}, DType::f64), {}), "conv2d",
               "takes 3 input channels", "[1, 4, 5, 5] has 4");
  EXPECT_ERROR(kernels::conv2d(x, test::random_normal({2, 4, 7, 3}, DType::f64), {}), "conv2d",
               "height window spans 7", "padded input has 5");
  Conv2dOptions g3;
  g3.groups = 3;
  EXPECT_ERROR(kernels::conv2d(x, w, g3), "conv2d", "groups = 3", "4 channels");
  Conv2dOptions s0;
  s0.stride_h = 0;
  EXPECT_ERROR(kernels::conv2d(x, w, s0), "conv2d", "stride (0, 1)");
  EXPECT_ERROR(kernels::conv2d(x, w.to(DType::f32), {}), "conv2d", "f64", "f32");
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_h = 2;
  EXPECT_ERROR(kernels::max_pool2d(x, p), "max_pool2d", "padding (2, 0)", "half the kernel");
  EXPECT_ERROR(kernels::avg_pool2d_backward(zeros({1, 4, 3, 3}, DType::f64), x.shape(),
                                            Pool2dOptions{2, 2, 2, 2, 0, 0, true}),
               "avg_pool2d_backward", "[1, 4, 3, 3]", "[1, 4, 2, 2]");
  EXPECT_ERROR(kernels::adaptive_avg_pool2d(x, 0, 2), "adaptive_avg_pool2d", "(0, 2)");
  const Pool2dOptions two{2, 2, 2, 2, 0, 0, true};
  EXPECT_ERROR(kernels::max_pool2d_backward(zeros({1, 4, 2, 2}, DType::f64),
                                            full({1, 4, 2, 2}, 99.0, DType::i64), x.shape(), two),
               "max_pool2d_backward", "index 99");
  // The gradient must have the pooling's output shape.
  EXPECT_ERROR(kernels::max_pool2d_backward(zeros({1, 4, 3, 3}, DType::f64),
                                            zeros({1, 4, 3, 3}, DType::i64), x.shape(), two),
               "max_pool2d_backward", "[1, 4, 3, 3]", "[1, 4, 2, 2]");
}

}  // namespace
}  // namespace accrue
