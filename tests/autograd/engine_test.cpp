// The backward engine's contract: order, fan-out, graph release, hooks, grad mode.
#include <gmock/gmock.h>

#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;

Tensor vec(std::vector<double> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}

TEST(Engine, gradient_of_a_product) {
  Tensor x = requires_grad_(vec({1, 2, 3}));
  Tensor y = requires_grad_(vec({4, 5, 6}));
  backward(sum(x * y));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(grad(y).to_vector<double>(), (std::vector<double>{1, 2, 3}));
}

TEST(Engine, fan_out_sums_the_contributions_of_every_use) {
  // f = sum(x*x + 3x): df/dx = 2x + 3; x feeds three uses.
  Tensor x = requires_grad_(vec({1, -2, 0.5}));
  backward(sum(x * x + x * 3.0));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{5, -1, 4}));
}

TEST(Engine, diamond_graph_runs_each_node_once_after_all_its_inputs) {
  // a = 2x; b = a*a; c = exp(a)... f = sum(b + c). The node of `a` must run
  // once, with both contributions summed.
  Tensor x = requires_grad_(vec({0.1, 0.2}));
  Tensor a = x * 2.0;
  backward(sum(a * a + exp(a)));
  const std::vector<double> xs = {0.1, 0.2};
  for (size_t i = 0; i < xs.size(); ++i) {
    const double av = 2 * xs[i];
    EXPECT_NEAR(grad(x).to_vector<double>()[i], 2 * (2 * av + std::exp(av)), 1e-12);
  }
}

TEST(Engine, leaf_gradients_add_across_backwards_until_cleared) {
  Tensor x = requires_grad_(vec({1, 2}));
  backward(sum(x * 3.0));
  backward(sum(x * 3.0));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{6, 6}));
  clear_grad(x);
  backward(sum(x * 3.0));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(Engine, second_backward_through_a_freed_graph_throws) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor loss = sum(exp(x));
  backward(loss);
  try {
    backward(loss);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("retain_graph"));
  }
}

TEST(Engine, retain_graph_allows_a_second_backward) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor loss = sum(exp(x));
  backward(loss, Tensor(), /*retain_graph=*/true);
  backward(loss);
  EXPECT_NEAR(grad(x).to_vector<double>()[0], 2 * std::exp(1.0), 1e-12);
}

TEST(Engine, saved_tensors_are_freed_after_backward) {
  Tensor x = requires_grad_(test::random_normal({1000}, DType::f64));
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  Tensor loss;
  {
    Tensor h = exp(x);  // saves its output
    loss = sum(h * h);
  }
  const int64_t with_graph = memory_stats(Device::cpu()).current_bytes;
  EXPECT_GT(with_graph, before);
  backward(loss);
  // What remains: the loss (8 bytes) and x's gradient (8000 bytes).
  EXPECT_LE(memory_stats(Device::cpu()).current_bytes, before + 8000 + 8);
}

// Note [Unary op saves]: a unary op keeps the one tensor its derivative
// reads: its output (exp, sqrt, tanh, sigmoid, rsqrt: the output's bytes
// stay held once the result handle is dropped) or its input (the leaf, held
// anyway: nothing more), and neg nothing. GELU kept its output too, which
// held every GELU output of a GPT-2 beside the FP8 codes of it.
TEST(Engine, unary_ops_save_only_what_their_backward_reads) {
  const int64_t n = 1000, bytes = n * 8;
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
    int64_t held;  // beyond the leaf and the 8-byte loss
  };
  const Case cases[] = {
      {"gelu", [](const Tensor& a) { return gelu(a); }, 0},
      {"silu", [](const Tensor& a) { return silu(a); }, 0},
      {"log", [](const Tensor& a) { return log(a); }, 0},
      {"pow", [](const Tensor& a) { return pow(a, 3.0); }, 0},
      {"sin", [](const Tensor& a) { return sin(a); }, 0},
      {"neg", [](const Tensor& a) { return neg(a); }, 0},
      {"exp", [](const Tensor& a) { return exp(a); }, bytes},
      {"sqrt", [](const Tensor& a) { return sqrt(a); }, bytes},
      {"tanh", [](const Tensor& a) { return tanh(a); }, bytes},
      {"sigmoid", [](const Tensor& a) { return sigmoid(a); }, bytes},
      {"rsqrt", [](const Tensor& a) { return rsqrt(a); }, bytes},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor a = requires_grad_(test::random_uniform({n}, 0.5, 2.0, DType::f64));
    const int64_t before = memory_stats(Device::cpu()).current_bytes;
    Tensor loss = sum(c.op(a));  // the op's result is dropped here
    EXPECT_EQ(memory_stats(Device::cpu()).current_bytes - before, c.held + 8);
    backward(loss);
    EXPECT_TRUE(grad(a).defined());
  }
}

// Each binary op keeps only what its backward reads: an add or a subtract
// nothing, a multiply its operands (not its output), a divide its divisor and
// its output (not the dividend). Measured as the bytes the graph holds once
// the op's result handle is dropped.
TEST(Engine, binary_ops_save_only_what_their_backward_reads) {
  const int64_t n = 1000, bytes = n * 8;
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    int64_t held;  // beyond the two leaves and the 8-byte loss
  };
  const Case cases[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, 0},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, 0},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, 0},
      {"div (output kept)", [](const Tensor& a, const Tensor& b) { return a / b; }, bytes},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor a = requires_grad_(test::random_normal({n}, DType::f64));
    Tensor b = requires_grad_(test::random_uniform({n}, 1.0, 2.0, DType::f64));
    const int64_t before = memory_stats(Device::cpu()).current_bytes;
    Tensor loss = sum(c.op(a, b));  // the op's result is dropped here
    EXPECT_EQ(memory_stats(Device::cpu()).current_bytes - before, c.held + 8);
    backward(loss);
    EXPECT_TRUE(grad(a).defined());
    EXPECT_TRUE(grad(b).defined());
  }
  // The gradients are still right (the formulas read what was kept).
  Tensor a = requires_grad_(test::random_uniform({3}, 1.0, 2.0, DType::f64));
  Tensor b = requires_grad_(test::random_uniform({3}, 1.0, 2.0, DType::f64));
  backward(sum(a / b - a * b + (a + b)));
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const std::vector<double> ga = grad(a).to_vector<double>(), gb = grad(b).to_vector<double>();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(ga[i], 1.0 / bv[i] - bv[i] + 1.0, 1e-14);
    EXPECT_NEAR(gb[i], -av[i] / (bv[i] * bv[i]) - av[i] + 1.0, 1e-14);
  }
}

TEST(Engine, no_grad_records_nothing) {
  Tensor x = requires_grad_(vec({1, 2}));
  NoGradGuard guard;
  Tensor y = x * 2.0;
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(grad_fn(y), nullptr);
}

TEST(Engine, detach_cuts_the_graph) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor y = detach(x * 2.0);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(is_leaf(y));
  Tensor z = requires_grad_(vec({1, 1}));
  backward(sum(y * z));
  EXPECT_FALSE(grad(x).defined());
  EXPECT_EQ(grad(z).to_vector<double>(), (std::vector<double>{2, 4}));
}

TEST(Engine, grad_ready_hook_fires_once_with_the_final_gradient) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor w = requires_grad_(vec({3, 4}));
  std::vector<std::vector<double>> seen;
  register_grad_ready_hook(
      x, [&](const Tensor& leaf) { seen.push_back(grad(leaf).to_vector<double>()); });
  // x is used three times: the hook must see the sum, once.
  backward(sum(x * w + x * x + x));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{3 + 2 + 1, 4 + 4 + 1}));
}

TEST(Engine, grad_sink_receives_the_gradient_instead_of_grad) {
  struct RecordingSink : GradSink {
    int calls = 0;
    std::vector<double> last;
    void accumulate(const Tensor&, const Tensor& g) override {
      ++calls;
      last = g.to_vector<double>();
    }
  } sink;
  Tensor x = requires_grad_(vec({1, 2}));
  set_grad_sink(x, &sink);
  backward(sum(x * x + x));
  EXPECT_EQ(sink.calls, 1);
  EXPECT_EQ(sink.last, (std::vector<double>{3, 5}));
  EXPECT_FALSE(grad(x).defined());
}

TEST(Engine, non_scalar_root_needs_a_seed) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor y = x * 2.0;
  EXPECT_THROW(backward(y), Error);
  backward(y, vec({1, 10}));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{2, 20}));
  EXPECT_THROW(backward(x * 2.0, vec({1, 2, 3})), Error);
}

TEST(Engine, root_without_grad_is_an_error) {
  EXPECT_THROW(backward(sum(vec({1, 2}))), Error);
}

TEST(Engine, requires_grad_only_on_float_leaves) {
  EXPECT_THROW(requires_grad_(from_vector<int64_t>({1}, {1})), Error);
  Tensor x = requires_grad_(vec({1}));
  EXPECT_THROW(requires_grad_(x * 2.0), Error);
}

TEST(Engine, unused_branch_gets_no_gradient) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor unused = requires_grad_(vec({5, 5}));
  Tensor branch = unused * 2.0;  // recorded but not part of the loss
  (void)branch;
  backward(sum(x));
  EXPECT_FALSE(grad(unused).defined());
}

// ---- Note [Fan-out sums in the backward] -------------------------------------

// x * scale recorded as a node that gathers x's gradient: it reports what it
// was given in *seen and returns scale * g plus the gathered gradient.
Tensor gathering_scale(const Tensor& x, double scale, Tensor* seen, bool drop = false) {
  return autograd::record_gathering(
      "GatheringScale", detach(x) * scale, {x}, 0,
      [=](const Tensor& g, const Tensor& gathered) -> std::vector<Tensor> {
        *seen = gathered.defined() ? gathered.clone() : Tensor();
        if (drop) return {Tensor()};
        const Tensor own = g * scale;
        return {gathered.defined() ? own + gathered : own};
      });
}

TEST(Engine, a_gathering_node_adds_the_gradient_gathered_before_it) {
  // x * 3 is recorded after the gathering node, so its backward runs first and
  // the gathering node is handed its 3s; the sum replaces the buffer.
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor seen;
  const Tensor a = gathering_scale(x, 2.0, &seen);
  backward(sum(a + x * 3.0));
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.to_vector<double>(), (std::vector<double>{3, 3}));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{5, 5}));
}

TEST(Engine, a_gathering_node_that_runs_first_is_handed_nothing) {
  // Recorded last, the gathering node runs first: nothing is gathered yet, and
  // the later use's gradient is added by the engine as before.
  Tensor x = requires_grad_(vec({1, 2}));
  const Tensor b = x * 3.0;
  Tensor seen = vec({-1});
  const Tensor a = gathering_scale(x, 2.0, &seen);
  backward(sum(a + b));
  EXPECT_FALSE(seen.defined());
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{5, 5}));
}

TEST(Engine, a_gathering_input_replaces_the_buffer_before_other_edges_add_to_it) {
  // One node with x as both inputs, gathering input 1: the other edge to the
  // same node must add to the replaced buffer, not be lost under it.
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor seen;
  const Tensor pair = autograd::record_gathering(
      "GatheringPair", detach(x) * 5.0, {x, x}, 1,
      [&seen](const Tensor& g, const Tensor& gathered) -> std::vector<Tensor> {
        seen = gathered.defined() ? gathered.clone() : Tensor();
        const Tensor own = g * 4.0;
        return {g, gathered.defined() ? own + gathered : own};  // 1 + 4 = 5
      });
  backward(sum(pair + x * 3.0));
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{8, 8}));
}

TEST(Engine, a_gathering_node_that_drops_the_gathered_gradient_throws) {
  Tensor x = requires_grad_(vec({1, 2}));
  Tensor seen;
  const Tensor a = gathering_scale(x, 2.0, &seen, /*drop=*/true);
  EXPECT_ERROR(backward(sum(a + x * 3.0)), "backward", "GatheringScale", "gathered for input 0",
               "returned none");
  EXPECT_ERROR(autograd::record_gathering(
                   "Bad", detach(x), {x}, 1,
                   [](const Tensor&, const Tensor&) { return std::vector<Tensor>{}; }),
               "record_gathering", "Bad", "input 1 of 1");
}

TEST(Engine, layer_norm_gathers_its_input_gradient_with_the_same_values) {
  // LayerNorm's node gathers x's gradient (Note [Fan-out sums in the
  // backward]); the gradients are those of the engine's add, in f64 to the
  // last bits, for x used before and after the norm.
  const Tensor x0 = test::random_normal({5, 8}, DType::f64);
  const Tensor w0 = test::random_normal({8}, DType::f64), b0 = test::random_normal({8}, DType::f64);
  const Tensor g0 = test::random_normal({5, 8}, DType::f64);
  for (bool other_use_first : {false, true}) {
    Tensor x = requires_grad_(x0.clone()), w = requires_grad_(w0.clone()),
           b = requires_grad_(b0.clone());
    Tensor other;
    if (other_use_first) other = x * x;
    const Tensor y = layer_norm(x, w, b, 1e-5);
    if (!other_use_first) other = x * x;
    EXPECT_EQ(std::string(grad_fn(y)->name()), "LayerNormBackward");
    EXPECT_EQ(grad_fn(y)->gathering_input(), 0);
    backward(sum(y * g0 + other));
    // The reference: LayerNorm's backward alone, plus 2x.
    const kernels::LayerNormOutput f = kernels::layer_norm(x0, w0, b0, 1e-5);
    const Tensor dx =
        kernels::layer_norm_backward(g0, x0, w0, f.mean, f.rstd, Tensor(), Tensor(), false);
    EXPECT_TRUE(test::all_close(grad(x), dx + x0 * 2.0, 1e-13, 1e-14)) << other_use_first;
  }
}

TEST(Engine, a_norm_never_writes_into_the_gradient_it_is_handed) {
  // t = s + w hands one tensor to both s's and w's buffers. The norm of s,
  // recorded after w and before t, runs after t's backward and before w's: it
  // is handed that tensor as s's gathered gradient (Note [Fan-out sums in the
  // backward]) while w's buffer still holds it. It must add it into a new dx:
  // written in place, w's backward would read the norm's sum instead.
  const Tensor s0 = test::random_normal({4, 8}, DType::f64);
  const Tensor g0 = test::random_normal({4, 8}, DType::f64);
  const Tensor d0 = test::random_normal({4, 8}, DType::f64);
  const Tensor scale = test::random_normal({8}, DType::f64);
  auto norm = [&](bool rms, const Tensor& x) {
    return rms ? rms_norm(x, scale, 1e-6) : layer_norm(x, scale, Tensor(), 1e-5);
  };
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    Tensor v = requires_grad_(test::random_normal({4, 8}, DType::f64));
    Tensor s = requires_grad_(s0.clone());
    const Tensor w = v * 2.0;
    const Tensor n = norm(rms, s);
    EXPECT_EQ(grad_fn(n)->gathering_input(), 0);
    const Tensor t = s + w;
    backward(sum(n * g0 + t * d0));
    EXPECT_TRUE(test::all_equal(grad(v), d0 * 2.0));
    // s's gradient: the norm's own plus d0, as the engine's add gives it.
    Tensor s_alone = requires_grad_(s0.clone());
    backward(sum(norm(rms, s_alone) * g0));
    EXPECT_TRUE(test::all_close(grad(s), grad(s_alone) + d0, 1e-13, 1e-14));
  }
}

// Note [NVTX ranges]: with the ranges on, each op's backward is one range
// named after its node (AccumulateGrad, the leaves, gets none).
TEST(Engine, each_backward_node_is_one_nvtx_range_when_on) {
  constexpr int64_t kPushedWhenOn = test::kNvtxPushedWhenOn;
  const Tensor a = requires_grad_(test::random_normal({3}, DType::f64));
  const Tensor b = requires_grad_(test::random_normal({3}, DType::f64));
  set_nvtx(true);
  const int64_t before = nvtx_ranges_pushed();
  backward(sum(a * b));  // SumBackward, MulBackward
  EXPECT_EQ(nvtx_ranges_pushed(), before + 2 * kPushedWhenOn);
  set_nvtx(false);
  const int64_t off = nvtx_ranges_pushed();
  backward(sum(a * b));
  EXPECT_EQ(nvtx_ranges_pushed(), off);
}

}  // namespace
}  // namespace accrue
