// The pointwise ops of research models (silu, rsqrt, sin, cos, abs, clamp,
// minimum/maximum, masked_fill, tril/triu, where with a scalar) pass a float64
// central-difference gradcheck, and their gradients at the points where the
// derivative is a convention (abs at 0, clamp at a bound, ties of
// minimum/maximum) are PyTorch's.
#include <cmath>
#include <optional>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::leaf;

Tensor positive_leaf(const Shape& shape) {
  return requires_grad_(test::random_uniform(shape, 0.5, 2.0, DType::f64));
}

Tensor bool_mask(const Shape& shape) {
  return test::random_integers(shape, 0, 1, DType::i64).to(DType::boolean);
}

// d(sum(w * f(x)))/dx by one backward, w a fixed weight.
Tensor grad_of(const Tensor& x, const std::function<Tensor(const Tensor&)>& f, const Tensor& w) {
  clear_grad(x);
  backward(sum(mul(f(x), w)));
  return grad(x);
}

TEST(PointwiseGradcheck, silu_rsqrt_sin_cos_abs) {
  EXPECT_GRADCHECK([](auto& v) { return silu(v[0]); }, leaf({3, 5}, 2.0));
  EXPECT_GRADCHECK([](auto& v) { return rsqrt(v[0]); }, positive_leaf({3, 5}));
  EXPECT_GRADCHECK([](auto& v) { return sin(v[0]); }, leaf({3, 5}, 2.0));
  EXPECT_GRADCHECK([](auto& v) { return cos(v[0]); }, leaf({3, 5}, 2.0));
  // abs is not differentiable at 0; random inputs are away from it.
  EXPECT_GRADCHECK([](auto& v) { return abs(v[0]); }, leaf({3, 5}));
  // Composed as a model uses them: RMSNorm's x * rsqrt(mean(x^2) + eps).
  EXPECT_GRADCHECK([](auto& v) { return v[0] * rsqrt(mean(v[0] * v[0], {-1}, true) + 1e-6); },
                   leaf({2, 6}));
}

TEST(PointwiseGradcheck, abs_has_gradient_zero_at_zero) {
  const Tensor x = requires_grad_(from_vector<double>({-1.5, 0.0, 2.0}, {3}, DType::f64));
  const Tensor w = from_vector<double>({2.0, 3.0, 5.0}, {3}, DType::f64);
  EXPECT_EQ(grad_of(
                x, [](const Tensor& t) { return abs(t); }, w)
                .to_vector<double>(),
            (std::vector<double>{-2.0, 0.0, 5.0}));
}

TEST(PointwiseGradcheck, clamp_with_both_or_one_bound) {
  // Random normals are away from the bounds by far more than the step.
  EXPECT_GRADCHECK([](auto& v) { return clamp(v[0], -0.5, 0.75); }, leaf({4, 6}));
  EXPECT_GRADCHECK([](auto& v) { return clamp(v[0], std::nullopt, 0.25); }, leaf({4, 6}));
  EXPECT_GRADCHECK([](auto& v) { return clamp(v[0], -0.25, std::nullopt); }, leaf({4, 6}));
}

TEST(PointwiseGradcheck, clamp_passes_the_gradient_at_the_bounds_as_pytorch) {
  const Tensor x =
      requires_grad_(from_vector<double>({-2.0, -1.0, 0.5, 1.0, 3.0}, {5}, DType::f64));
  const Tensor w = from_vector<double>({1.0, 2.0, 3.0, 4.0, 5.0}, {5}, DType::f64);
  EXPECT_EQ(grad_of(
                x, [](const Tensor& t) { return clamp(t, -1.0, 1.0); }, w)
                .to_vector<double>(),
            (std::vector<double>{0.0, 2.0, 3.0, 4.0, 0.0}));
  EXPECT_ERROR(clamp(x, 1.0, -1.0), "clamp", "min 1", "max -1");
}

TEST(PointwiseGradcheck, minimum_and_maximum_with_broadcasting) {
  for (auto op : std::vector<std::function<Tensor(const std::vector<Tensor>&)>>{
           [](auto& v) { return minimum(v[0], v[1]); },
           [](auto& v) { return maximum(v[0], v[1]); }}) {
    EXPECT_GRADCHECK(op, leaf({3, 4}), leaf({3, 4}));
    EXPECT_GRADCHECK(op, leaf({3, 1}), leaf({4}));  // both broadcast
    EXPECT_GRADCHECK(op, leaf({2, 3}), leaf({}));   // a 0-d operand
  }
}

TEST(PointwiseGradcheck, minimum_and_maximum_split_ties_in_half) {
  const Tensor a = requires_grad_(from_vector<double>({1.0, 2.0, 3.0}, {3}, DType::f64));
  const Tensor b = requires_grad_(from_vector<double>({2.0, 2.0, 1.0}, {3}, DType::f64));
  const Tensor w = from_vector<double>({4.0, 6.0, 8.0}, {3}, DType::f64);
  backward(sum(mul(maximum(a, b), w)));
  EXPECT_EQ(grad(a).to_vector<double>(), (std::vector<double>{0.0, 3.0, 8.0}));
  EXPECT_EQ(grad(b).to_vector<double>(), (std::vector<double>{4.0, 3.0, 0.0}));
  clear_grad(a);
  clear_grad(b);
  backward(sum(mul(minimum(a, b), w)));
  EXPECT_EQ(grad(a).to_vector<double>(), (std::vector<double>{4.0, 3.0, 0.0}));
  EXPECT_EQ(grad(b).to_vector<double>(), (std::vector<double>{0.0, 3.0, 8.0}));
  // A broadcast operand sums its share over the broadcast dims.
  const Tensor c = requires_grad_(from_vector<double>({2.0}, {1}, DType::f64));
  backward(sum(mul(maximum(detach(a), c), w)));
  EXPECT_EQ(grad(c).item(), 4.0 + 3.0);
}

TEST(PointwiseGradcheck, masked_fill_tril_triu) {
  const Tensor mask = bool_mask({4, 1});
  EXPECT_GRADCHECK([mask](auto& v) { return masked_fill(v[0], mask, -3.0); }, leaf({2, 4, 5}));
  for (int64_t diagonal : {-1, 0, 2}) {
    EXPECT_GRADCHECK([diagonal](auto& v) { return tril(v[0], diagonal); }, leaf({2, 4, 5}));
    EXPECT_GRADCHECK([diagonal](auto& v) { return triu(v[0], diagonal); }, leaf({2, 4, 5}));
  }
  // On a transposed (strided) input.
  EXPECT_GRADCHECK([](auto& v) { return tril(transpose(v[0], 0, 1), 1); }, leaf({5, 3}));
}

TEST(PointwiseGradcheck, masked_fill_gives_zero_gradient_where_masked) {
  const Tensor x = leaf({3, 4});
  const Tensor mask = bool_mask({4});
  const Tensor w = test::random_normal({3, 4}, DType::f64);
  const std::vector<double> g =
      grad_of(
          x, [&](const Tensor& t) { return masked_fill(t, mask, 9.0); }, w)
          .to_vector<double>();
  const std::vector<double> vm = mask.to_vector<double>(), vw = w.to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(g[i * 4 + j], vm[j] != 0 ? 0.0 : vw[i * 4 + j]);
}

TEST(PointwiseGradcheck, where_with_a_scalar_operand) {
  const Tensor cond = bool_mask({3, 1});
  EXPECT_GRADCHECK([cond](auto& v) { return where(cond, v[0], -2.0); }, leaf({3, 4}));
  EXPECT_GRADCHECK([cond](auto& v) { return where(cond, 0.5, v[0]); }, leaf({4}));  // broadcast
}

// The pieces of a Llama-style block from these ops alone, through one
// gradcheck: RMSNorm (rsqrt), rotary embeddings (sin and cos tables of the
// positions), causal attention scores masked by triu + masked_fill, SwiGLU
// (silu), and a clamp and maximum on the way out.
TEST(PointwiseGradcheck, a_llama_style_block_from_the_new_ops) {
  constexpr int64_t T = 4, D = 6;
  const Tensor positions = arange(0, T, 1, DType::f64).view({T, 1});
  const Tensor freqs = from_vector<double>({1.0, 0.1, 0.01}, {1, D / 2}, DType::f64);
  const Tensor angles = kernels::binary(kernels::BinaryOp::Mul, positions, freqs);  // [T, D/2]
  const Tensor causal = kernels::compare(
      kernels::CompareOp::Ne, kernels::triu(ones({T, T}, DType::f64), 1), zeros({}, DType::f64));
  auto block = [=](const std::vector<Tensor>& v) {
    const Tensor& x = v[0];
    const Tensor& w = v[1];
    const Tensor h = x * rsqrt(mean(x * x, {-1}, true) + 1e-6) * w;  // RMSNorm
    // Rotary embedding in the rotate-half form.
    const Tensor h1 = narrow(h, -1, 0, D / 2), h2 = narrow(h, -1, D / 2, D / 2);
    const Tensor c = cos(angles), s = sin(angles);
    const Tensor q = h1 * c - h2 * s, k = h2 * c + h1 * s;
    const Tensor scores = masked_fill(matmul(q, transpose(k, 0, 1)), causal, -1e9);
    const Tensor attn = softmax(scores, -1);
    const Tensor mixed = matmul(attn, h);                 // [T, D]
    const Tensor gated = silu(mixed) * abs(mixed + 0.5);  // SwiGLU-like, an abs on the up path
    return maximum(clamp(gated, -2.0, 2.0), tril(ones({T, D}, DType::f64) * -0.5, 2));
  };
  EXPECT_GRADCHECK(block, leaf({T, D}),
                   requires_grad_(test::random_uniform({D}, 0.5, 1.5, DType::f64)));
}

}  // namespace
}  // namespace accrue
