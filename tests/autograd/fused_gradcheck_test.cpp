// The differentiable transformer fusions of autograd/transformer_ops.h —
// dropout, linear_gelu, residual_layer_norm — pass the float64 gradcheck,
// agree with the unfused ops they replace, and deliver their parameter
// gradients into the arena (Note [Fused weight-gradient accumulation]).
#include <string>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/dropout.h"
#include "accrue/kernels/ops.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::all_close;
using test::all_equal;

using test::leaf;

// ---- dropout -------------------------------------------------------------------------------

TEST(FusedGradcheck, dropout_with_a_fixed_generator_state) {
  Generator gen;
  // Every evaluation restarts the generator, so every one uses the same mask.
  auto f = [&gen](const std::vector<Tensor>& v) {
    gen.set_state(11, 3);
    return dropout(v[0], 0.3, true, &gen);
  };
  EXPECT_GRADCHECK(f, leaf({4, 5}));
  EXPECT_GRADCHECK(f, leaf({2, 3, 7}));
}

TEST(FusedGradcheck, dropout_reserves_counters_and_backward_uses_the_same_mask) {
  Generator gen(21);
  gen.set_state(21, 8);
  const Tensor x = leaf({5, 7});
  const Tensor y = dropout(x, 0.5, true, &gen);
  EXPECT_EQ(gen.offset(), 8u + 18u);  // 35 elements: 18 Philox blocks
  EXPECT_TRUE(all_equal(y, kernels::dropout(x, 0.5, 21, 8)));
  const Tensor g = test::random_normal({5, 7}, DType::f64);
  backward(y, g);
  EXPECT_TRUE(all_equal(grad(x), kernels::dropout(g, 0.5, 21, 8)));
  // A second call draws a new mask.
  const Tensor y2 = dropout(x, 0.5, true, &gen);
  EXPECT_FALSE(all_equal(y2, y));
  EXPECT_EQ(gen.offset(), 8u + 36u);
}

TEST(FusedGradcheck, dropout_uses_the_default_generator_when_none_is_given) {
  const uint64_t before = default_generator().offset();
  const uint64_t seed = default_generator().seed();
  const Tensor x = leaf({10});
  const Tensor y = dropout(x, 0.2);
  EXPECT_EQ(default_generator().offset(), before + 5);
  EXPECT_TRUE(all_equal(y, kernels::dropout(x, 0.2, seed, before)));
}

TEST(FusedGradcheck, dropout_off_or_p_zero_returns_the_input_itself) {
  Generator gen(3);
  const Tensor x = leaf({4, 4});
  for (const Tensor& y : {dropout(x, 0.5, false, &gen), dropout(x, 0.0, true, &gen)}) {
    EXPECT_EQ(y.data_ptr(), x.data_ptr());
    EXPECT_TRUE(is_leaf(y));
    EXPECT_TRUE(y.requires_grad());
  }
  EXPECT_EQ(gen.offset(), 0u);  // nothing drawn
}

TEST(FusedGradcheck, dropout_bad_inputs_throw_naming_the_value) {
  const Tensor x = leaf({3});
  EXPECT_ERROR(dropout(x, 1.0), "dropout", "p = 1", "[0, 1)");
  EXPECT_ERROR(dropout(x, -0.1, false), "dropout", "p = -0.1");
  EXPECT_ERROR(dropout(x, 1.5, true, nullptr), "dropout", "p = 1.5");
  EXPECT_ERROR(dropout(Tensor(), 0.1), "dropout", "undefined");
  EXPECT_ERROR(dropout(ones({3}, DType::i32), 0.1), "dropout", "i32");
}

// ---- linear + GELU -------------------------------------------------------------------------

TEST(FusedGradcheck, linear_gelu) {
  auto f = [](const std::vector<Tensor>& v) { return linear_gelu(v[0], v[1], v[2]); };
  EXPECT_GRADCHECK(f, leaf({2, 3, 4}), leaf({5, 4}), leaf({5}));
  EXPECT_GRADCHECK(f, leaf({6, 4}, 2.0), leaf({3, 4}), leaf({3}));
  EXPECT_GRADCHECK(f, leaf({4}), leaf({2, 4}), leaf({2}));  // a 1-D input: one row
  // Only some inputs need a gradient.
  const Tensor w = test::random_normal({5, 4}, DType::f64);
  EXPECT_GRADCHECK([w](const std::vector<Tensor>& v) { return linear_gelu(v[0], w, v[1]); },
                   leaf({3, 4}), leaf({5}));
}

TEST(FusedGradcheck, linear_gelu_equals_gelu_of_linear_with_gradients) {
  const Tensor x0 = test::random_normal({2, 5, 6}, DType::f64);
  const Tensor w0 = test::random_normal({7, 6}, DType::f64);
  const Tensor b0 = test::random_normal({7}, DType::f64);
  const Tensor g = test::random_normal({2, 5, 7}, DType::f64);
  const Tensor x = requires_grad_(x0.clone()), w = requires_grad_(w0.clone()),
               b = requires_grad_(b0.clone());
  const Tensor xr = requires_grad_(x0.clone()), wr = requires_grad_(w0.clone()),
               br = requires_grad_(b0.clone());
  const Tensor y = linear_gelu(x, w, b);
  const Tensor yr = gelu(linear(xr, wr, br));
  EXPECT_EQ(y.shape(), (Shape{2, 5, 7}));
  EXPECT_EQ(std::string(grad_fn(y)->name()), "LinearGeluBackward");
  EXPECT_TRUE(all_close(y, yr, 1e-13, 1e-13));
  backward(y, g);
  backward(yr, g);
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-12, 1e-13));
  EXPECT_TRUE(all_close(grad(w), grad(wr), 1e-12, 1e-13));
  EXPECT_TRUE(all_close(grad(b), grad(br), 1e-12, 1e-13));
}

// The weight and bias gradients go straight into their arena slots: the first
// backward of a window writes them (over stale values), the next one adds.
TEST(FusedGradcheck, linear_gelu_parameter_gradients_land_in_the_arena) {
  const Tensor x0 = test::random_normal({9, 6}, DType::f64);
  const Tensor w0 = test::random_normal({8, 6}, DType::f64);
  const Tensor b0 = test::random_normal({8}, DType::f64);
  const Tensor wr = requires_grad_(w0.clone()), br = requires_grad_(b0.clone());
  const Tensor xr = requires_grad_(x0.clone());
  backward(sum(linear_gelu(xr, wr, br)));

  const Tensor w = requires_grad_(w0.clone()), b = requires_grad_(b0.clone());
  GradArena arena({{"fc.weight", w}, {"fc.bias", b}}, GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(123.0);
  arena.begin_window();
  const Tensor x = requires_grad_(x0.clone());
  backward(sum(linear_gelu(x, w, b)));
  EXPECT_TRUE(arena.written(0));
  EXPECT_TRUE(arena.written(1));
  EXPECT_TRUE(all_close(arena.grad_view(0), grad(wr), 1e-12, 1e-14));
  EXPECT_TRUE(all_close(arena.grad_view(1), grad(br), 1e-12, 1e-14));
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-12, 1e-14));
  backward(sum(linear_gelu(x0, w, b)));
  EXPECT_TRUE(all_close(arena.grad_view(0),
                        kernels::binary_scalar(kernels::BinaryOp::Mul, grad(wr), 2.0), 1e-12,
                        1e-14));
  EXPECT_TRUE(all_close(arena.grad_view(1),
                        kernels::binary_scalar(kernels::BinaryOp::Mul, grad(br), 2.0), 1e-12,
                        1e-14));
}

TEST(FusedGradcheck, linear_gelu_bad_inputs_throw_naming_shapes) {
  const Tensor x = leaf({3, 4}), w = leaf({5, 4}), b = leaf({5});
  EXPECT_ERROR(linear_gelu(leaf({3, 6}), w, b), "linear_gelu", "[3, 6]", "[5, 4]");
  EXPECT_ERROR(linear_gelu(x, leaf({5}), b), "linear_gelu", "weight", "[5]");
  EXPECT_ERROR(linear_gelu(x, w, leaf({4})), "linear_gelu", "bias", "[4]", "[5]");
  EXPECT_ERROR(linear_gelu(x, w, Tensor()), "linear_gelu", "bias", "undefined");
  EXPECT_ERROR(linear_gelu(Tensor(), w, b), "linear_gelu", "input", "undefined");
}

// ---- residual + layer norm -------------------------------------------------------------------

TEST(FusedGradcheck, residual_layer_norm_through_both_results) {
  auto both = [](const std::vector<Tensor>& v) {
    const ResidualNorm r = residual_layer_norm(v[0], v[1], v[2], v[3], 1e-5);
    return r.normed * 2.0 + r.sum * r.sum;
  };
  EXPECT_GRADCHECK(both, leaf({3, 6}), leaf({3, 6}), leaf({6}), leaf({6}));
  EXPECT_GRADCHECK(both, leaf({2, 2, 5}), leaf({2, 2, 5}, 3.0), leaf({5}), leaf({5}));
  auto normed_only = [](const std::vector<Tensor>& v) {
    return residual_layer_norm(v[0], v[1], Tensor(), Tensor(), 1e-5).normed;
  };
  EXPECT_GRADCHECK(normed_only, leaf({4, 7}), leaf({4, 7}));
  auto sum_only = [](const std::vector<Tensor>& v) {
    return residual_layer_norm(v[0], v[1], v[2], v[3], 1e-5).sum;
  };
  EXPECT_GRADCHECK(sum_only, leaf({4, 3}), leaf({4, 3}), leaf({3}), leaf({3}));
}

TEST(FusedGradcheck, residual_layer_norm_records_an_add_and_a_layer_norm_of_it) {
  const Tensor x = leaf({3, 8}), res = leaf({3, 8}), w = leaf({8}), b = leaf({8});
  const ResidualNorm r = residual_layer_norm(x, res, w, b);
  ASSERT_NE(grad_fn(r.sum), nullptr);
  ASSERT_NE(grad_fn(r.normed), nullptr);
  EXPECT_EQ(std::string(grad_fn(r.sum)->name()), "AddBackward");
  EXPECT_EQ(std::string(grad_fn(r.normed)->name()), "LayerNormBackward");
  EXPECT_EQ(grad_fn(r.normed)->next_edges().at(0).fn, grad_fn(r.sum));

  // The same values and gradients as add then layer_norm.
  const Tensor xr = requires_grad_(detach(x).clone()), rr = requires_grad_(detach(res).clone());
  const Tensor wr = requires_grad_(detach(w).clone()), br = requires_grad_(detach(b).clone());
  const Tensor sr = xr + rr;
  const Tensor nr = layer_norm(sr, wr, br, 1e-5);
  EXPECT_TRUE(all_equal(r.sum, sr));
  EXPECT_TRUE(all_equal(r.normed, nr));
  const Tensor g1 = test::random_normal({3, 8}, DType::f64),
               g2 = test::random_normal({3, 8}, DType::f64);
  backward(sum(r.normed * g1 + r.sum * g2));
  backward(sum(nr * g1 + sr * g2));
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(grad(res), grad(rr), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(grad(w), grad(wr), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(grad(b), grad(br), 1e-13, 1e-14));
}

TEST(FusedGradcheck, residual_layer_norm_parameter_gradients_land_in_the_arena) {
  const Tensor x0 = test::random_normal({5, 6}, DType::f64);
  const Tensor r0 = test::random_normal({5, 6}, DType::f64);
  const Tensor w0 = test::random_normal({6}, DType::f64);
  const Tensor b0 = test::random_normal({6}, DType::f64);
  const Tensor wr = requires_grad_(w0.clone()), br = requires_grad_(b0.clone());
  backward(sum(layer_norm(x0 + r0, wr, br, 1e-5) * x0));

  const Tensor w = requires_grad_(w0.clone()), b = requires_grad_(b0.clone());
  GradArena arena({{"ln.weight", w}, {"ln.bias", b}}, GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(-7.0);
  arena.begin_window();
  backward(sum(residual_layer_norm(x0, r0, w, b).normed * x0));
  EXPECT_TRUE(all_close(arena.grad_view(0), grad(wr), 1e-12, 1e-14));
  EXPECT_TRUE(all_close(arena.grad_view(1), grad(br), 1e-12, 1e-14));
  backward(sum(residual_layer_norm(x0, r0, w, b).normed * x0));
  EXPECT_TRUE(all_close(arena.grad_view(1),
                        kernels::binary_scalar(kernels::BinaryOp::Mul, grad(br), 2.0), 1e-12,
                        1e-14));
}

TEST(FusedGradcheck, residual_layer_norm_bad_inputs_throw_naming_shapes) {
  EXPECT_ERROR(residual_layer_norm(leaf({2, 4}), leaf({2, 5}), leaf({4}), leaf({4})),
               "residual_layer_norm", "[2, 4]", "[2, 5]");
  EXPECT_ERROR(residual_layer_norm(leaf({2, 4}), leaf({2, 4}), leaf({3}), leaf({4})),
               "residual_layer_norm", "weight", "[3]");
  EXPECT_ERROR(residual_layer_norm(leaf({2, 4}), leaf({2, 4}), leaf({4}), leaf({4}), -1.0),
               "residual_layer_norm", "eps");
}

}  // namespace
}  // namespace accrue
