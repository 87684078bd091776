// Note [Composed convolution] on the CPU: the im2col + GEMM convolution the
// CUDA path runs equals the CPU reference (kernels/cpu/conv.cpp) in f64, for
// the forward, the data gradient and the weight gradient written (beta 0) and
// added (beta 1), over stride, padding, dilation, groups and odd shapes; so
// does the composed adaptive average pooling.
#include <cmath>
#include <limits>

#include "accrue/kernels/conv.h"
#include "accrue/kernels/conv_backend.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

struct Case {
  const char* name;
  Shape x, w;
  Conv2dOptions o;
};

Conv2dOptions options(int64_t stride, int64_t pad_h, int64_t pad_w, int64_t dilation,
                      int64_t groups) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = stride;
  o.pad_h = pad_h;
  o.pad_w = pad_w;
  o.dilation_h = o.dilation_w = dilation;
  o.groups = groups;
  return o;
}

kernels::Conv2dGeometry geometry(const Case& c) {
  return kernels::conv_geometry(c.x, c.w, c.o, "test");
}

const Case kCases[] = {
    {"plain 3x3", {2, 3, 7, 6}, {4, 3, 3, 3}, options(1, 0, 0, 1, 1)},
    {"stride 2, padding (1, 2)", {2, 3, 9, 8}, {5, 3, 3, 2}, options(2, 1, 2, 1, 1)},
    {"dilation 2", {1, 2, 9, 9}, {3, 2, 3, 3}, options(1, 2, 1, 2, 1)},
    {"groups 2", {2, 4, 6, 5}, {6, 2, 3, 3}, options(1, 1, 1, 1, 2)},
    {"depthwise, stride 2", {2, 4, 8, 8}, {4, 1, 3, 3}, options(2, 1, 1, 1, 4)},
    {"1x1", {3, 5, 4, 4}, {2, 5, 1, 1}, options(1, 0, 0, 1, 1)},
    {"stem 7x7 stride 2 padding 3", {1, 3, 16, 16}, {4, 3, 7, 7}, options(2, 3, 3, 1, 1)},
};

TEST(ComposedConv, equals_the_cpu_reference_forward_and_both_gradients) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const kernels::Conv2dGeometry g = geometry(c);
    const Tensor x = test::random_normal(c.x, DType::f64);
    const Tensor w = test::random_normal(c.w, DType::f64);
    const Tensor y = kernels::conv2d(x, w, c.o);  // the CPU reference
    ASSERT_EQ(y.shape(), (Shape{g.n, g.o, g.oh, g.ow}));
    EXPECT_LE(test::relative_error(kernels::composed::conv2d(x, w, g), y), 1e-13);

    const Tensor dy = test::random_normal(y.shape(), DType::f64);
    EXPECT_LE(test::relative_error(kernels::composed::conv2d_backward_input(dy, w, g),
                                   kernels::conv2d_backward_input(dy, w, c.x, c.o)),
              1e-13);

    // Beta 0 never reads the slot (NaN there stays out); beta 1 adds to it.
    const Tensor expected = empty(c.w, DType::f64);
    kernels::conv2d_backward_weight(dy, x, expected, c.o, 0.0);
    Tensor slot = full(c.w, std::numeric_limits<double>::quiet_NaN(), DType::f64);
    kernels::composed::conv2d_backward_weight(dy, x, slot, g, 0.0);
    EXPECT_LE(test::relative_error(slot, expected), 1e-13);
    kernels::composed::conv2d_backward_weight(dy, x, slot, g, 1.0);
    EXPECT_LE(
        test::relative_error(slot, kernels::binary_scalar(kernels::BinaryOp::Mul, expected, 2.0)),
        1e-13);
  }
}

TEST(ComposedConv, a_strided_input_view_gives_the_same_result) {
  // The input as a channels-last (NHWC-strided) view and as a narrowed view.
  const Case c = kCases[1];
  const kernels::Conv2dGeometry g = geometry(c);
  const Tensor x = test::random_normal(c.x, DType::f64);
  const Tensor w = test::random_normal(c.w, DType::f64);
  const Tensor nhwc = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  EXPECT_TRUE(
      test::all_equal(kernels::composed::conv2d(nhwc, w, g), kernels::composed::conv2d(x, w, g)));
  Tensor wider = test::random_normal({2, 3, 9, 10}, DType::f64);
  wider.narrow(3, 1, 8).copy_(x);
  EXPECT_TRUE(test::all_equal(kernels::composed::conv2d(wider.narrow(3, 1, 8), w, g),
                              kernels::composed::conv2d(x, w, g)));
}

TEST(ComposedConv, adaptive_average_pooling_equals_the_cpu_reference) {
  // Divisible, non-divisible (overlapping cells) and the global 1 x 1 of a ResNet head.
  const struct {
    Shape x;
    int64_t oh, ow;
  } cases[] = {{{2, 3, 8, 6}, 4, 3}, {{2, 3, 7, 5}, 3, 2}, {{3, 4, 5, 5}, 1, 1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(shape_str(c.x));
    kernels::Conv2dGeometry g;
    g.n = c.x[0];
    g.c = g.o = c.x[1];
    g.h = c.x[2];
    g.w = c.x[3];
    g.oh = c.oh;
    g.ow = c.ow;
    const Tensor x = test::random_normal(c.x, DType::f64);
    const Tensor y = kernels::adaptive_avg_pool2d(x, c.oh, c.ow);
    EXPECT_LE(test::relative_error(kernels::composed::adaptive_avg_pool2d(x, g), y), 1e-14);
    const Tensor dy = test::random_normal(y.shape(), DType::f64);
    EXPECT_LE(test::relative_error(kernels::composed::adaptive_avg_pool2d_backward(dy, g),
                                   kernels::adaptive_avg_pool2d_backward(dy, c.x)),
              1e-14);
  }
}

TEST(ComposedConv, average_pooling_equals_the_cpu_reference) {
  for (bool include_pad : {true, false}) {
    Pool2dOptions p;
    p.kernel_h = 3;
    p.kernel_w = 2;
    p.stride_h = 2;
    p.stride_w = 1;
    p.pad_h = p.pad_w = 1;
    p.count_include_pad = include_pad;
    SCOPED_TRACE(include_pad);
    const Shape shape{2, 3, 9, 8};
    const kernels::Conv2dGeometry g = kernels::pool_geometry(shape, p, "test");
    const Tensor x = test::random_normal(shape, DType::f64);
    const Tensor y = kernels::avg_pool2d(x, p);
    EXPECT_LE(test::relative_error(kernels::composed::avg_pool2d(x, g, include_pad), y), 1e-14);
    const Tensor dy = test::random_normal(y.shape(), DType::f64);
    EXPECT_LE(test::relative_error(kernels::composed::avg_pool2d_backward(dy, g, include_pad),
                                   kernels::avg_pool2d_backward(dy, shape, p)),
              1e-14);
  }
}

// Note [Pointwise convolution as a GEMM] on the CPU: the 1 x 1 convolution of
// a channels-last input as GEMMs on views equals the CPU reference in f64,
// with channels-last results, the data gradient from a channels-last and from
// an NCHW output gradient, the weight gradient written (beta 0, NaN slot) and
// added (beta 1).
TEST(PointwiseConv, equals_the_cpu_reference_with_channels_last_results) {
  const Conv2dOptions o;  // 1 x 1: stride 1, no padding
  for (const Shape& xs : {Shape{2, 6, 5, 3}, Shape{3, 4, 1, 1}, Shape{1, 8, 7, 7}}) {
    SCOPED_TRACE(shape_str(xs));
    const Shape ws = {5, xs[1], 1, 1};
    const kernels::Conv2dGeometry g = kernels::conv_geometry(xs, ws, o, "test");
    const Tensor x = test::random_normal(xs, DType::f64), w = test::random_normal(ws, DType::f64);
    const Tensor xl = test::as_channels_last(x);
    ASSERT_TRUE(kernels::pointwise::applies(xl, g));
    const Tensor y = kernels::pointwise::conv2d(xl, w, g);
    EXPECT_EQ(y.stride(1), 1) << "the output is channels-last";
    EXPECT_LE(test::relative_error(y, kernels::conv2d(x, w, o)), 1e-14);

    const Tensor dy = test::random_normal(y.shape(), DType::f64);
    const Tensor dx_expected = kernels::conv2d_backward_input(dy, w, xs, o);
    for (const Tensor& g_in : {dy, test::as_channels_last(dy)}) {
      const Tensor dx = kernels::pointwise::conv2d_backward_input(g_in, w, g);
      EXPECT_EQ(dx.stride(1), 1);
      EXPECT_LE(test::relative_error(dx, dx_expected), 1e-14);
    }
    const Tensor dw_expected = empty(ws, DType::f64);
    kernels::conv2d_backward_weight(dy, x, dw_expected, o, 0.0);
    Tensor slot = full(ws, std::numeric_limits<double>::quiet_NaN(), DType::f64);
    kernels::pointwise::conv2d_backward_weight(test::as_channels_last(dy), xl, slot, g, 0.0);
    EXPECT_LE(test::relative_error(slot, dw_expected), 1e-14);
    kernels::pointwise::conv2d_backward_weight(dy, xl, slot, g, 1.0);
    EXPECT_LE(test::relative_error(
                  slot, kernels::binary_scalar(kernels::BinaryOp::Mul, dw_expected, 2.0)),
              1e-14);
  }
}

TEST(PointwiseConv, applies_only_to_unit_stride_unpadded_single_group_1x1_channels_last) {
  const Tensor x = test::random_normal({2, 4, 6, 6});
  const Tensor xl = test::as_channels_last(x);
  Conv2dOptions plain, strided, padded, grouped;
  strided.stride_h = strided.stride_w = 2;
  padded.pad_h = padded.pad_w = 1;
  grouped.groups = 2;
  auto geometry_of = [](const Shape& w, const Conv2dOptions& o) {
    return kernels::conv_geometry({2, 4, 6, 6}, w, o, "test");
  };
  EXPECT_TRUE(kernels::pointwise::applies(xl, geometry_of({3, 4, 1, 1}, plain)));
  EXPECT_FALSE(kernels::pointwise::applies(x, geometry_of({3, 4, 1, 1}, plain)));  // NCHW
  EXPECT_FALSE(kernels::pointwise::applies(xl, geometry_of({3, 4, 3, 3}, plain)));
  EXPECT_FALSE(kernels::pointwise::applies(xl, geometry_of({3, 4, 1, 1}, strided)));
  EXPECT_FALSE(kernels::pointwise::applies(xl, geometry_of({3, 4, 1, 1}, padded)));
  EXPECT_FALSE(kernels::pointwise::applies(xl, geometry_of({4, 2, 1, 1}, grouped)));
}

}  // namespace
}  // namespace accrue
