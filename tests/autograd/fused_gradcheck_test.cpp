// The differentiable transformer fusions of autograd/transformer_ops.h —
// dropout, linear_gelu, residual_layer_norm, rms_norm, add_rms_norm, qk_norm,
// rope, swiglu — pass the float64 gradcheck, agree with the unfused ops they
// replace, deliver their parameter gradients into the arena (Note [Fused
// weight-gradient accumulation]) and train inside a Window.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/dropout.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
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

// ---- linear + GELU + linear (a transformer's MLP) -------------------------------------------

TEST(FusedGradcheck, linear_gelu_linear) {
  auto f = [](const std::vector<Tensor>& v) {
    return linear_gelu_linear(v[0], v[1], v[2], v[3], v[4]);
  };
  EXPECT_GRADCHECK(f, leaf({2, 3, 4}), leaf({6, 4}), leaf({6}), leaf({5, 6}), leaf({5}));
  EXPECT_GRADCHECK(f, leaf({4}), leaf({3, 4}), leaf({3}), leaf({2, 3}), leaf({2}));  // one row
  // Only some inputs need a gradient: no fc parameter, then no input at all.
  const Tensor w1 = test::random_normal({6, 4}, DType::f64),
               b1 = test::random_normal({6}, DType::f64);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& v) { return linear_gelu_linear(v[0], w1, b1, v[1], v[2]); },
      leaf({3, 4}), leaf({5, 6}), leaf({5}));
  const Tensor x = test::random_normal({3, 4}, DType::f64);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& v) { return linear_gelu_linear(x, w1, b1, v[0], v[1]); },
      leaf({5, 6}), leaf({5}));
}

// On the CPU the node computes the two ops it replaces, bit for bit, forward
// and backward (Note [GELU gradient epilogue]: only CUDA's epilogue rounds once).
TEST(FusedGradcheck, linear_gelu_linear_gives_the_bits_of_the_two_ops) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = test::random_normal({2, 5, 6}, dt), g = test::random_normal({2, 5, 3}, dt);
    const Tensor w10 = test::random_normal({8, 6}, dt, Device::cpu(), 0.4),
                 b10 = test::random_normal({8}, dt), w20 = test::random_normal({3, 8}, dt),
                 b20 = test::random_normal({3}, dt);
    auto run = [&](bool fused) {
      const Tensor x = requires_grad_(x0.clone()), w1 = requires_grad_(w10.clone()),
                   b1 = requires_grad_(b10.clone()), w2 = requires_grad_(w20.clone()),
                   b2 = requires_grad_(b20.clone());
      const Tensor y =
          fused ? linear_gelu_linear(x, w1, b1, w2, b2) : linear(linear_gelu(x, w1, b1), w2, b2);
      if (fused) {
        EXPECT_EQ(std::string(grad_fn(y)->name()), "LinearGeluLinearBackward");
      }
      backward(y, g);
      return std::vector<Tensor>{y, grad(x), grad(w1), grad(b1), grad(w2), grad(b2)};
    };
    const std::vector<Tensor> fused = run(true), two = run(false);
    const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2"};
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(test::all_equal(fused[i], two[i])) << names[i];
  }
}

// The four parameter gradients land in their arena slots: written by the
// window's first backward, added by the next.
TEST(FusedGradcheck, linear_gelu_linear_parameter_gradients_land_in_the_arena) {
  const Tensor x0 = test::random_normal({9, 6}, DType::f64);
  const std::vector<Tensor> p0 = {
      test::random_normal({8, 6}, DType::f64), test::random_normal({8}, DType::f64),
      test::random_normal({4, 8}, DType::f64), test::random_normal({4}, DType::f64)};
  std::vector<Tensor> ref;
  for (const Tensor& p : p0)
    ref.push_back(requires_grad_(p.clone()));
  backward(sum(linear(linear_gelu(x0, ref[0], ref[1]), ref[2], ref[3])));

  std::vector<Tensor> p;
  for (const Tensor& t : p0)
    p.push_back(requires_grad_(t.clone()));
  GradArena arena(
      {{"fc.weight", p[0]}, {"fc.bias", p[1]}, {"proj.weight", p[2]}, {"proj.bias", p[3]}},
      GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(123.0);
  arena.begin_window();
  backward(sum(linear_gelu_linear(x0, p[0], p[1], p[2], p[3])));
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(arena.written(i)) << i;
    EXPECT_TRUE(all_close(arena.grad_view(i), grad(ref[i]), 1e-12, 1e-14)) << i;
  }
  backward(sum(linear_gelu_linear(x0, p[0], p[1], p[2], p[3])));
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(all_close(arena.grad_view(i),
                          kernels::binary_scalar(kernels::BinaryOp::Mul, grad(ref[i]), 2.0), 1e-12,
                          1e-14))
        << i;
}

TEST(FusedGradcheck, linear_gelu_linear_bad_inputs_throw_naming_shapes) {
  const Tensor x = leaf({3, 4}), w1 = leaf({6, 4}), b1 = leaf({6}), w2 = leaf({5, 6}),
               b2 = leaf({5});
  const char* op = "linear_gelu_linear";
  EXPECT_ERROR(linear_gelu_linear(leaf({3, 7}), w1, b1, w2, b2), op, "[3, 7]", "[6, 4]");
  EXPECT_ERROR(linear_gelu_linear(x, w1, b1, leaf({5, 7}), b2), op, "[5, 7]", "6");
  EXPECT_ERROR(linear_gelu_linear(x, leaf({6}), b1, w2, b2), op, "2-D", "[6]");
  EXPECT_ERROR(linear_gelu_linear(x, w1, leaf({5}), w2, b2), op, "biases", "[5]", "[6, 4]");
  EXPECT_ERROR(linear_gelu_linear(x, w1, b1, w2, Tensor()), op, "biases", "undefined");
  EXPECT_ERROR(linear_gelu_linear(Tensor(), w1, b1, w2, b2), op, "input", "undefined");
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

// ---- RMSNorm -------------------------------------------------------------------------------

TEST(FusedGradcheck, rms_norm_with_and_without_weight) {
  auto f = [](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-5); };
  EXPECT_GRADCHECK(f, leaf({3, 6}), leaf({6}));
  EXPECT_GRADCHECK(f, leaf({2, 3, 5}, 3.0), leaf({5}));
  EXPECT_GRADCHECK(f, leaf({7}), leaf({7}));  // one row
  auto plain = [](const std::vector<Tensor>& v) { return rms_norm(v[0], Tensor(), 1e-2); };
  EXPECT_GRADCHECK(plain, leaf({4, 5}));
  // The weight alone.
  const Tensor x = test::random_normal({3, 4}, DType::f64);
  EXPECT_GRADCHECK([x](const std::vector<Tensor>& v) { return rms_norm(x, v[0]); }, leaf({4}));
}

TEST(FusedGradcheck, rms_norm_equals_the_composed_formula_with_gradients) {
  const Tensor x0 = test::random_normal({2, 5, 6}, DType::f64);
  const Tensor w0 = test::random_normal({6}, DType::f64);
  const Tensor g = test::random_normal({2, 5, 6}, DType::f64);
  const Tensor x = requires_grad_(x0.clone()), w = requires_grad_(w0.clone());
  const Tensor xr = requires_grad_(x0.clone()), wr = requires_grad_(w0.clone());
  const Tensor y = rms_norm(x, w, 1e-4);
  const Tensor yr = xr * rsqrt(mean(xr * xr, {-1}, true) + 1e-4) * wr;
  EXPECT_EQ(std::string(grad_fn(y)->name()), "RmsNormBackward");
  EXPECT_TRUE(all_close(y, yr, 1e-13, 1e-14));
  backward(y, g);
  backward(yr, g);
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-12, 1e-13));
  EXPECT_TRUE(all_close(grad(w), grad(wr), 1e-12, 1e-13));
}

TEST(FusedGradcheck, qk_norm_of_q_and_k_views_of_a_packed_qkv) {
  // qkv [B, T, 3 * H * D] -> q, k [B, T, H, D] strided views, each normalized per head.
  const int64_t b = 2, t = 3, h = 2, d = 4;
  auto f = [=](const std::vector<Tensor>& v) {
    const Tensor parts = reshape(v[0], {b, t, 3, h, d});
    return qk_norm(select(parts, 2, 0), v[1]) * 2.0 + qk_norm(select(parts, 2, 1), v[2]);
  };
  EXPECT_GRADCHECK(f, leaf({b, t, 3 * h * d}), leaf({d}), leaf({d}));
}

TEST(FusedGradcheck, rms_norm_weight_gradient_lands_in_the_arena) {
  const Tensor x0 = test::random_normal({5, 6}, DType::f64);
  const Tensor w0 = test::random_normal({6}, DType::f64);
  const Tensor wr = requires_grad_(w0.clone());
  backward(sum(rms_norm(x0, wr) * x0));

  const Tensor w = requires_grad_(w0.clone());
  GradArena arena({{"norm.weight", w}}, GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(-7.0);
  arena.begin_window();
  backward(sum(rms_norm(x0, w) * x0));
  EXPECT_TRUE(arena.written(0));
  EXPECT_TRUE(all_close(arena.grad_view(0), grad(wr), 1e-12, 1e-14));
  backward(sum(add_rms_norm(x0, zeros({5, 6}, DType::f64), w).normed * x0));
  EXPECT_TRUE(all_close(arena.grad_view(0),
                        kernels::binary_scalar(kernels::BinaryOp::Mul, grad(wr), 2.0), 1e-12,
                        1e-14));
}

TEST(FusedGradcheck, add_rms_norm_through_both_results) {
  auto both = [](const std::vector<Tensor>& v) {
    const ResidualNorm r = add_rms_norm(v[0], v[1], v[2], 1e-5);
    return r.normed * 2.0 + r.sum * r.sum;
  };
  EXPECT_GRADCHECK(both, leaf({3, 6}), leaf({3, 6}), leaf({6}));
  EXPECT_GRADCHECK(both, leaf({2, 2, 5}), leaf({2, 2, 5}, 3.0), leaf({5}));
  auto normed_only = [](const std::vector<Tensor>& v) {
    return add_rms_norm(v[0], v[1], Tensor(), 1e-5).normed;
  };
  EXPECT_GRADCHECK(normed_only, leaf({4, 7}), leaf({4, 7}));
}

TEST(FusedGradcheck, add_rms_norm_records_an_add_and_an_rms_norm_of_it) {
  const Tensor x = leaf({3, 8}), res = leaf({3, 8}), w = leaf({8});
  const ResidualNorm r = add_rms_norm(x, res, w);
  EXPECT_EQ(std::string(grad_fn(r.sum)->name()), "AddBackward");
  EXPECT_EQ(std::string(grad_fn(r.normed)->name()), "RmsNormBackward");
  EXPECT_EQ(grad_fn(r.normed)->next_edges().at(0).fn, grad_fn(r.sum));
  const Tensor xr = requires_grad_(detach(x).clone()), rr = requires_grad_(detach(res).clone());
  const Tensor wr = requires_grad_(detach(w).clone());
  const Tensor sr = xr + rr;
  const Tensor nr = rms_norm(sr, wr);
  EXPECT_TRUE(all_equal(r.sum, sr));
  EXPECT_TRUE(all_equal(r.normed, nr));
  const Tensor g1 = test::random_normal({3, 8}, DType::f64),
               g2 = test::random_normal({3, 8}, DType::f64);
  backward(sum(r.normed * g1 + r.sum * g2));
  backward(sum(nr * g1 + sr * g2));
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(grad(res), grad(rr), 1e-13, 1e-14));
  EXPECT_TRUE(all_close(grad(w), grad(wr), 1e-13, 1e-14));
}

TEST(FusedGradcheck, rms_norm_bad_inputs_throw_naming_values) {
  EXPECT_ERROR(rms_norm(leaf({2, 4}), leaf({3})), "rms_norm", "weight", "[3]", "[4]");
  EXPECT_ERROR(rms_norm(leaf({2, 4}), leaf({4}), 0.0), "rms_norm", "eps", "got 0");
  EXPECT_ERROR(add_rms_norm(leaf({2, 4}), leaf({2, 5}), leaf({4})), "add_rms_norm", "[2, 4]",
               "[2, 5]");
  EXPECT_ERROR(add_rms_norm(leaf({2, 4}), leaf({2, 4}), leaf({4}), -1.0), "add_rms_norm", "eps");
}

// ---- rotary embedding ------------------------------------------------------------------------

TEST(FusedGradcheck, rope_both_styles_plain_and_llama3_scaled) {
  const Tensor pos_bt = from_vector<int64_t>({0, 5, 17, 3, 0, 1}, {2, 3});
  const Tensor pos_t = from_vector<int64_t>({2, 40, 9}, {3});
  // original_max_position 64 puts pairs of a 16-wide head in all three bands.
  const RopeScaling llama3 = RopeScaling::llama3(8.0, 1.0, 4.0, 64);
  for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
    for (const RopeScaling& s : {RopeScaling{}, llama3}) {
      for (const Tensor& pos : {pos_bt, pos_t}) {
        auto f = [&](const std::vector<Tensor>& v) { return rope(v[0], pos, 10000.0, style, s); };
        EXPECT_GRADCHECK(f, leaf({2, 3, 2, 16}));
      }
    }
  }
}

TEST(FusedGradcheck, rope_of_q_and_k_views_of_a_packed_qkv) {
  const int64_t b = 2, t = 3, h = 2, d = 6;
  const Tensor pos = from_vector<int64_t>({0, 1, 2, 0, 1, 0}, {b, t});
  auto f = [=](const std::vector<Tensor>& v) {
    const Tensor parts = reshape(v[0], {b, t, 3, h, d});
    const Tensor q = rope(select(parts, 2, 0), pos), k = rope(select(parts, 2, 1), pos);
    return q * k + select(parts, 2, 2);
  };
  EXPECT_GRADCHECK(f, leaf({b, t, 3 * h * d}));
  const Tensor x = leaf({b, t, h, d});
  const Tensor y = rope(x, pos);
  EXPECT_EQ(std::string(grad_fn(y)->name()), "RopeBackward");
}

TEST(FusedGradcheck, rope_bad_inputs_throw_naming_values) {
  const Tensor pos = from_vector<int64_t>({0, 1, 2}, {3});
  EXPECT_ERROR(rope(leaf({2, 3, 2, 5}), pos), "rope", "head dim D = 5");
  EXPECT_ERROR(rope(leaf({2, 3, 2, 4}), pos.to(DType::f64)), "rope", "positions", "f64", "i64");
  EXPECT_ERROR(rope(leaf({2, 3, 2, 4}), from_vector<int64_t>({0, -3, 2}, {3})), "rope", "positions",
               "-3");
  EXPECT_ERROR(rope(leaf({3, 2, 4}), pos), "rope", "[3, 2, 4]");
}

// ---- SwiGLU ----------------------------------------------------------------------------------

TEST(FusedGradcheck, swiglu_and_its_packed_form) {
  auto f = [](const std::vector<Tensor>& v) { return swiglu(v[0], v[1]); };
  EXPECT_GRADCHECK(f, leaf({3, 5}, 2.0), leaf({3, 5}));
  EXPECT_GRADCHECK(f, leaf({2, 2, 4}, 3.0), leaf({2, 2, 4}));
  auto packed = [](const std::vector<Tensor>& v) { return swiglu_packed(v[0]); };
  EXPECT_GRADCHECK(packed, leaf({3, 8}, 2.0));
  EXPECT_GRADCHECK(packed, leaf({2, 3, 6}, 2.0));
  // Only one input needs a gradient.
  const Tensor up = test::random_normal({4, 3}, DType::f64);
  EXPECT_GRADCHECK([up](const std::vector<Tensor>& v) { return swiglu(v[0], up); },
                   leaf({4, 3}, 2.0));
}

TEST(FusedGradcheck, swiglu_equals_silu_times_up_with_gradients) {
  const Tensor x0 = test::random_normal({4, 10}, DType::f64, Device::cpu(), 2.0);
  const Tensor g = test::random_normal({4, 5}, DType::f64);
  const Tensor x = requires_grad_(x0.clone()), xr = requires_grad_(x0.clone());
  const Tensor y = swiglu_packed(x);
  const Tensor yr = silu(narrow(xr, 1, 0, 5)) * narrow(xr, 1, 5, 5);
  EXPECT_EQ(std::string(grad_fn(y)->name()), "SwigluBackward");
  EXPECT_TRUE(all_close(y, yr, 1e-14, 1e-15));
  backward(y, g);
  backward(yr, g);
  EXPECT_TRUE(all_close(grad(x), grad(xr), 1e-13, 1e-14));
}

TEST(FusedGradcheck, swiglu_bad_inputs_throw_naming_values) {
  EXPECT_ERROR(swiglu(leaf({2, 4}), leaf({2, 5})), "swiglu", "[2, 4]", "[2, 5]");
  EXPECT_ERROR(swiglu_packed(leaf({2, 5})), "swiglu_packed", "[2, 5]", "even");
}

// ---- inside a Window ------------------------------------------------------------------------

// A Llama-style block whose every step is one of the fused ops: RMSNorm and
// its residual form, q/k norm and rotary embeddings on views of a packed qkv,
// a packed SwiGLU MLP. Every op is per token, so splitting the batch changes
// nothing a token sees.
class LlamaBlockRun {
 public:
  static constexpr int64_t kT = 3, kH = 2, kD = 4, kC = kH * kD, kF = 6, kClasses = 3;

  explicit LlamaBlockRun(int64_t micro_steps)
      : gen_(7),
        norm1_(norm_weight(kC, 0.0)),
        norm2_(norm_weight(kC, 0.3)),
        q_norm_(norm_weight(kD, 0.6)),
        qkv_(kC, 3 * kC, false, {Device::cpu(), DType::f64, &gen_}),
        gate_up_(kC, 2 * kF, false, {Device::cpu(), DType::f64, &gen_}),
        down_(kF, kC, false, {Device::cpu(), DType::f64, &gen_}),
        head_(kC, kClasses, true, {Device::cpu(), DType::f64, &gen_}),
        opt_(optim::AdamWOptions(1e-2).weight_decay(0.1)),
        store_(params(), optim::ParamStoreOptions().master_dtype(DType::f64)),
        window_(store_, opt_, optim::WindowOptions().micro_steps(micro_steps)) {}

  // x [n, T, C], positions [n, T], y [n * T].
  void micro_step(const Tensor& x, const Tensor& positions, const Tensor& y) {
    const int64_t n = x.size(0);
    const Tensor h = rms_norm(x, norm1_);
    const Tensor parts = reshape(qkv_.forward(h), {n, kT, 3, kH, kD});
    const Tensor q = rope(qk_norm(select(parts, 2, 0), q_norm_), positions, 100.0);
    const Tensor k = rope(select(parts, 2, 1), positions, 100.0, RopeStyle::Interleaved);
    const Tensor attn = reshape(q * k + select(parts, 2, 2), {n, kT, kC});
    const ResidualNorm r = add_rms_norm(attn, x, norm2_);
    const Tensor mlp = down_.forward(swiglu_packed(gate_up_.forward(r.normed)));
    const Tensor out = reshape(mlp + r.sum, {n * kT, kC});
    window_.backward(cross_entropy(head_.forward(out), y));
  }
  void close() { window_.close(); }
  std::vector<double> parameters() const {
    std::vector<double> out;
    for (const Tensor& p : params())
      for (double v : p.to_vector<double>())
        out.push_back(v);
    return out;
  }
  optim::Window& window() { return window_; }

 private:
  // A fixed weight around 1 (both runs must start from the same values).
  static Tensor norm_weight(int64_t n, double phase) {
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i)
      v[i] = 1.0 + 0.3 * std::sin(phase + static_cast<double>(i));
    return requires_grad_(from_vector(v, {n}, DType::f64));
  }

  std::vector<Tensor> params() const {
    std::vector<Tensor> p = {norm1_, norm2_, q_norm_};
    for (const nn::Linear* l : {&qkv_, &gate_up_, &down_, &head_})
      for (const Tensor& t : l->parameters())
        p.push_back(t);
    return p;
  }

  Generator gen_;
  Tensor norm1_, norm2_, q_norm_;
  nn::Linear qkv_, gate_up_, down_, head_;
  optim::Optimizer opt_;
  optim::ParamStore store_;
  optim::Window window_;
};

TEST(FusedInWindow, two_micro_batches_update_as_the_large_batch) {
  LlamaBlockRun split(2), whole(1);
  const std::vector<double> before = whole.parameters();
  const int64_t t = LlamaBlockRun::kT, c = LlamaBlockRun::kC;
  for (int w = 0; w < 3; ++w) {
    const Tensor x = test::random_normal({4, t, c}, DType::f64, Device::cpu(), 1.5);
    const Tensor pos = from_vector<int64_t>({0, 1, 2, 0, 1, 0, 5, 6, 7, 0, 1, 2}, {4, t});
    const Tensor y = test::random_integers({4 * t}, 0, 2, DType::i64);
    split.micro_step(x.narrow(0, 0, 2), pos.narrow(0, 0, 2), y.narrow(0, 0, 2 * t));
    split.micro_step(x.narrow(0, 2, 2), pos.narrow(0, 2, 2), y.narrow(0, 2 * t, 2 * t));
    split.close();
    whole.micro_step(x, pos, y);
    whole.close();
    EXPECT_FALSE(whole.window().report().skipped);
    EXPECT_FALSE(split.window().report().skipped);
    const std::vector<double> a = split.parameters(), b = whole.parameters();
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::fabs(a[i] - b[i]));
      scale = std::max(scale, std::fabs(b[i]));
    }
    EXPECT_LE(worst / scale, 1e-12) << "window " << w;
  }
  EXPECT_NE(whole.parameters(), before);
}

TEST(FusedInWindow, a_bad_position_is_deferred_and_skips_the_window) {
  LlamaBlockRun run(2);
  const int64_t t = LlamaBlockRun::kT, c = LlamaBlockRun::kC;
  const Tensor x = test::random_normal({2, t, c}, DType::f64);
  const Tensor y = test::random_integers({2 * t}, 0, 2, DType::i64);
  const Tensor good = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {2, t});
  const Tensor bad = from_vector<int64_t>({0, 1, 2, 0, -4, 2}, {2, t});
  run.micro_step(x, good, y);
  run.micro_step(x, good, y);
  run.close();
  EXPECT_FALSE(run.window().report().skipped);
  const std::vector<double> stepped = run.parameters();
  run.micro_step(x, good, y);
  EXPECT_NO_THROW(run.micro_step(x, bad, y));
  run.close();
  EXPECT_EQ(run.parameters(), stepped);
  EXPECT_ERROR(run.window().report(), "rope", "positions", "-4", "micro-step 1", "skipped");
}

}  // namespace
}  // namespace accrue
