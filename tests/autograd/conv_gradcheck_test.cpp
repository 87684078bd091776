// conv2d and pooling (autograd/conv_ops.h): float64 gradchecks over the
// options, the weight gradient landing in a gradient-arena slot (Note [Fused
// weight-gradient accumulation]), and nn::Conv2d.
#include <limits>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/nn/module.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::Conv2dOptions;
using kernels::Pool2dOptions;

using test::leaf;

TEST(ConvGradcheck, conv2d_over_stride_padding_dilation_and_groups) {
  Conv2dOptions plain, strided, dilated, grouped;
  strided.stride_h = 2;
  strided.stride_w = 1;
  strided.pad_h = 1;
  strided.pad_w = 2;
  dilated.dilation_h = 2;
  dilated.dilation_w = 2;
  dilated.pad_h = dilated.pad_w = 1;
  grouped.groups = 2;
  for (const Conv2dOptions& o : {plain, strided, dilated, grouped}) {
    SCOPED_TRACE("stride " + std::to_string(o.stride_h) + " dilation " +
                 std::to_string(o.dilation_h) + " groups " + std::to_string(o.groups));
    EXPECT_GRADCHECK([o](auto& v) { return conv2d(v[0], v[1], v[2], o); }, leaf({2, 4, 6, 5}),
                     leaf({3 * o.groups, 4 / o.groups, 3, 2}), leaf({3 * o.groups}));
  }
  EXPECT_GRADCHECK([](auto& v) { return conv2d(v[0], v[1], Tensor()); }, leaf({1, 2, 4, 4}),
                   leaf({2, 2, 1, 1}));
}

TEST(ConvGradcheck, pooling) {
  Pool2dOptions p;
  p.kernel_h = 3;
  p.kernel_w = 2;
  p.stride_h = 2;
  p.stride_w = 1;
  p.pad_h = 1;
  // Random normal values have no ties, so max pooling is differentiable there.
  EXPECT_GRADCHECK([p](auto& v) { return max_pool2d(v[0], p); }, leaf({2, 3, 7, 5}));
  EXPECT_GRADCHECK([p](auto& v) { return avg_pool2d(v[0], p); }, leaf({2, 3, 7, 5}));
  Pool2dOptions q = p;
  q.count_include_pad = false;
  EXPECT_GRADCHECK([q](auto& v) { return avg_pool2d(v[0], q); }, leaf({1, 2, 6, 4}));
  EXPECT_GRADCHECK([](auto& v) { return adaptive_avg_pool2d(v[0], 3, 2); }, leaf({2, 2, 7, 5}));
}

// The weight gradient is written into its slot with beta 0, then added with
// beta 1: two backwards give the sum of two separate gradients.
TEST(ConvGradcheck, the_weight_gradient_lands_in_its_arena_slot) {
  Generator gen(3);
  nn::Conv2d conv(2, 3, 3, true, {Device::cpu(), DType::f64, &gen});
  GradArena arena(conv.named_parameters(), GradArenaOptions().dtype(DType::f64));
  const Tensor x1 = test::random_normal({2, 2, 5, 5}, DType::f64);
  const Tensor x2 = test::random_normal({2, 2, 5, 5}, DType::f64);
  // The reference: the same weights outside any arena.
  const Tensor w = requires_grad_(detach(conv.weight()).clone());
  const Tensor b = requires_grad_(detach(conv.bias()).clone());
  backward(sum(conv2d(x1, w, b)));
  backward(sum(conv2d(x2, w, b)));
  arena.grads().fill_(std::numeric_limits<double>::quiet_NaN());  // a write must not read these
  arena.begin_window();
  backward(sum(conv.forward(x1)));
  backward(sum(conv.forward(x2)));
  EXPECT_LE(test::relative_error(arena.grad_view(0).reshape(w.shape()), grad(w)), 1e-14);
  EXPECT_LE(test::relative_error(arena.grad_view(1), grad(b)), 1e-14);
}

TEST(ConvGradcheck, group_norm) {
  EXPECT_GRADCHECK([](auto& v) { return group_norm(v[0], 2, v[1], v[2]); }, leaf({2, 4, 3, 3}),
                   leaf({4}), leaf({4}));
  EXPECT_GRADCHECK([](auto& v) { return group_norm(v[0], 3, Tensor(), Tensor()); },
                   leaf({2, 6, 5}));
}

// One group is LayerNorm over each whole sample (accrue's fused kernel, an
// independent path); C groups normalize each channel on its own.
TEST(ConvGradcheck, group_norm_matches_layer_norm_and_per_channel_statistics) {
  const Tensor x = test::random_normal({3, 4, 5, 2}, DType::f64);
  const Tensor ln = layer_norm(x.reshape({3, 40}), Tensor(), Tensor(), 1e-5).reshape(x.shape());
  EXPECT_LE(test::relative_error(group_norm(x, 1, Tensor(), Tensor()), ln), 1e-13);
  const Tensor per_channel = group_norm(x, 4, Tensor(), Tensor());
  const std::vector<double> v =
      per_channel.narrow(0, 1, 1).narrow(1, 2, 1).contiguous().to_vector<double>();
  double m = 0.0, s = 0.0;
  for (double e : v)
    m += e / 10.0;
  for (double e : v)
    s += (e - m) * (e - m) / 10.0;
  EXPECT_NEAR(m, 0.0, 1e-14);
  EXPECT_NEAR(s, 1.0, 1e-4);  // eps = 1e-5 inside the root
  // bf16 keeps f32 statistics and returns bf16.
  const Tensor b = group_norm(x.to(DType::bf16), 2, Tensor(), Tensor());
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_LE(test::relative_error(b.to(DType::f64), group_norm(x, 2, Tensor(), Tensor())), 1e-2);
  Generator gen(2);
  nn::GroupNorm module(2, 4, {Device::cpu(), DType::f64, &gen});
  EXPECT_LE(test::relative_error(module.forward(x), group_norm(x, 2, Tensor(), Tensor())), 1e-15);
}

// Note [Fused batch norm]: the one-node batch_norm against finite differences
// in f64, against the composed formula (and its statistics), and its affine
// gradients landing in arena slots with beta 0 then 1.
TEST(ConvGradcheck, batch_norm) {
  EXPECT_GRADCHECK([](auto& v) { return batch_norm(v[0], v[1], v[2], 1e-5).out; },
                   leaf({3, 4, 3, 2}), leaf({4}), leaf({4}));
  EXPECT_GRADCHECK([](auto& v) { return batch_norm(v[0], v[1], v[2], 0.1).out; }, leaf({5, 3}),
                   leaf({3}), leaf({3}));
}

TEST(ConvGradcheck, batch_norm_matches_the_composed_formula) {
  const Tensor x = test::random_normal({4, 3, 5, 2}, DType::f64) + 2.0;
  const Tensor w = test::random_normal({3}, DType::f64), b = test::random_normal({3}, DType::f64);
  const BatchNormResult r = batch_norm(x, w, b, 1e-3);
  const Tensor mean = accrue::mean(x, {0, 2, 3}, /*keepdim=*/true);
  const Tensor var = accrue::mean((x - mean) * (x - mean), {0, 2, 3}, /*keepdim=*/true);
  const Tensor y =
      (x - mean) / sqrt(var + 1e-3) * w.reshape({1, 3, 1, 1}) + b.reshape({1, 3, 1, 1});
  EXPECT_LE(test::relative_error(r.out, y), 1e-14);
  EXPECT_LE(test::relative_error(r.mean, mean.reshape({3})), 1e-15);
  EXPECT_LE(test::relative_error(r.var, var.reshape({3})), 1e-14);
  // bf16: f32 statistics (Note [BatchNorm in f32]), a bf16 output.
  const BatchNormResult h =
      batch_norm(x.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16), 1e-3);
  EXPECT_EQ(h.out.dtype(), DType::bf16);
  EXPECT_EQ(h.mean.dtype(), DType::f32);
  EXPECT_LE(test::relative_error(h.out.to(DType::f64), y), 2e-2);
}

TEST(ConvGradcheck, batch_norm_affine_gradients_land_in_their_arena_slots) {
  const Tensor w = requires_grad_(test::random_normal({3}, DType::f64));
  const Tensor b = requires_grad_(test::random_normal({3}, DType::f64));
  GradArena arena({w, b}, GradArenaOptions().dtype(DType::f64));
  const Tensor x1 = test::random_normal({2, 3, 4}, DType::f64);
  const Tensor x2 = test::random_normal({2, 3, 4}, DType::f64);
  const Tensor rw = requires_grad_(detach(w).clone()), rb = requires_grad_(detach(b).clone());
  for (const Tensor& x : {x1, x2})
    backward(sum(batch_norm(x, rw, rb, 1e-5).out * x));
  arena.grads().fill_(std::numeric_limits<double>::quiet_NaN());  // a write must not read these
  arena.begin_window();
  for (const Tensor& x : {x1, x2})
    backward(sum(batch_norm(x, w, b, 1e-5).out * x));
  EXPECT_LE(test::relative_error(arena.grad_view(0), grad(rw)), 1e-14);
  EXPECT_LE(test::relative_error(arena.grad_view(1), grad(rb)), 1e-14);
}

TEST(ConvGradcheck, bad_module_and_bias_shapes_are_errors) {
  const Tensor x = test::random_normal({2, 6, 3}, DType::f64);
  EXPECT_ERROR(group_norm(x, 4, Tensor(), Tensor()), "group_norm", "4 groups", "6 channels");
  EXPECT_ERROR(group_norm(x, 2, zeros({5}, DType::f64), Tensor()), "group_norm",
               "weight has shape [5]", "expected [6]");
  EXPECT_ERROR(group_norm(x.reshape({36}), 1, Tensor(), Tensor()), "group_norm", "[36]");
  const Tensor c6 = zeros({6}, DType::f64);
  EXPECT_ERROR(batch_norm(x, zeros({5}, DType::f64), c6, 1e-5), "batch_norm",
               "weight has shape [5]", "expected [6]");
  EXPECT_ERROR(batch_norm(x, c6, zeros({6}, DType::f32), 1e-5), "batch_norm", "bias is f32",
               "the input f64");
  EXPECT_ERROR(batch_norm(x, c6, c6, 0.0), "batch_norm", "eps = 0");
  EXPECT_ERROR(batch_norm(x.narrow(0, 0, 1).narrow(2, 0, 1), c6, c6, 1e-5), "batch_norm",
               "more than one value per channel", "[1, 6, 1]");
  EXPECT_ERROR(batch_norm(x.reshape({36}), c6, c6, 1e-5), "batch_norm", "[36]");
  EXPECT_ERROR(nn::GroupNorm(4, 6, {Device::cpu(), DType::f64, nullptr}), "GroupNorm", "4 groups");
  Generator gen(1);
  EXPECT_ERROR(nn::Conv2d(3, 4, 3, true, {Device::cpu(), DType::f64, &gen}, {1, 1, 0, 0, 1, 1, 2}),
               "Conv2d", "in=3", "groups=2");
  EXPECT_ERROR(
      conv2d(test::random_normal({1, 2, 4, 4}, DType::f64),
             test::random_normal({3, 2, 3, 3}, DType::f64), test::random_normal({2}, DType::f64)),
      "conv2d", "bias has shape [2]", "expected [3]");
}

}  // namespace
}  // namespace accrue
