// The pointwise ops of research models (silu, rsqrt, sin, cos, abs, clamp,
// minimum/maximum, masked_fill, tril/triu, where with a scalar) pass a float64
// central-difference gradcheck, and their gradients at the points where the
// derivative is a convention (abs at 0, clamp at a bound, ties of
// minimum/maximum) are PyTorch's; a model made of them accumulates in a
// Window exactly as its large batch does.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
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

// ---- inside a Window ------------------------------------------------------------------------

// A two-layer model whose hidden activations go through every new op (each on
// per-item values, so that splitting the batch changes nothing an item sees).
class PointwiseRun {
 public:
  explicit PointwiseRun(int64_t micro_steps)
      : gen_(3),
        hidden_(6, 8, true, {Device::cpu(), DType::f64, &gen_}),
        head_(8, 3, true, {Device::cpu(), DType::f64, &gen_}),
        opt_(optim::AdamWOptions(1e-2).weight_decay(0.1)),
        store_(params(), optim::ParamStoreOptions().master_dtype(DType::f64)),
        window_(store_, opt_, optim::WindowOptions().micro_steps(micro_steps)) {}

  void micro_step(const Tensor& x, const Tensor& y) {
    const int64_t n = x.size(0);
    const Tensor mask = from_vector<int32_t>({0, 1, 0, 0, 0, 0, 1, 0}, {1, 8}, DType::boolean);
    Tensor h = hidden_.forward(x);
    h = silu(h) * cos(h) + abs(sin(h));
    h = maximum(clamp(h, -1.0, 1.0), minimum(h * 0.5, rsqrt(h * h + 1.0)));
    h = masked_fill(h, mask, 0.0);
    h = reshape(tril(reshape(h, {n, 2, 4}), 1) + triu(reshape(h, {n, 2, 4}), 2), {n, 8});
    h = where(mask, 0.25, h);
    window_.backward(cross_entropy(head_.forward(h), y));
  }
  void close() { window_.close(); }
  std::vector<double> parameters() const {
    std::vector<double> out;
    for (const Tensor& p : params())
      for (double v : p.to_vector<double>())
        out.push_back(v);
    return out;
  }
  const optim::Window& window() const { return window_; }

 private:
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = hidden_.parameters();
    for (const Tensor& t : head_.parameters())
      p.push_back(t);
    return p;
  }

  Generator gen_;
  nn::Linear hidden_, head_;
  optim::Optimizer opt_;
  optim::ParamStore store_;
  optim::Window window_;
};

// The model trains in a Window, and two micro-batches of 4 give the update of
// one batch of 8, window after window (Note [Accumulation verifier]).
TEST(PointwiseInWindow, two_micro_batches_update_as_the_large_batch) {
  PointwiseRun split(2), whole(1);
  const std::vector<double> before = whole.parameters();
  for (int w = 0; w < 3; ++w) {
    const Tensor x = test::random_normal({8, 6}, DType::f64, Device::cpu(), 1.5);
    const Tensor y = test::random_integers({8}, 0, 2, DType::i64);
    split.micro_step(x.narrow(0, 0, 4), y.narrow(0, 0, 4));
    split.micro_step(x.narrow(0, 4, 4), y.narrow(0, 4, 4));
    split.close();
    whole.micro_step(x, y);
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
  const std::vector<double> after = whole.parameters();
  EXPECT_NE(after, before);
}

}  // namespace
}  // namespace accrue
