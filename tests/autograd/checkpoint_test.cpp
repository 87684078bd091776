// Activation checkpointing (Note [Activation checkpointing], Note [Checkpoint
// outputs]): the gradients of a checkpointed function are bitwise those of
// the plain one, on the CPU in f64.
#include "accrue/autograd/checkpoint.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr int64_t kIn = 6, kHidden = 10;

// The parameters a checkpointed function captures.
struct Params {
  Tensor w1, b1, w2, b2, gamma;
  std::vector<Tensor> all() const { return {w1, b1, w2, b2, gamma}; }
};

Params make_params() {
  auto p = [](const Shape& s) {
    return requires_grad_(test::random_normal(s, DType::f64, Device::cpu(), 0.5));
  };
  return {p({kHidden, kIn}), p({kHidden}), p({kIn, kHidden}), p({kIn}), p({kIn})};
}

// Two layers and a LayerNorm; x is used twice, so fan-out happens inside.
Tensor body(const Tensor& x, const Params& p) {
  Tensor h = gelu(linear(x, p.w1, p.b1));
  return layer_norm(linear(h, p.w2, p.b2), p.gamma, Tensor()) * x;
}

void clear_grads(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    clear_grad(t);
}

// The gradients of every parameter, in order (cloned: later backwards add to .grad).
std::vector<Tensor> grads_of(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts)
    out.push_back(grad(t).defined() ? grad(t).clone() : Tensor());
  return out;
}

void expect_all_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << "gradient " << i;
    if (a[i].defined()) {
      EXPECT_TRUE(test::all_equal(a[i], b[i])) << "gradient " << i;
    }
  }
}

TEST(Checkpoint, gradients_are_bitwise_those_of_the_plain_function) {
  const Params p = make_params();
  const Tensor x0 = test::random_normal({4, 3, kIn}, DType::f64);
  // Ops before and after the checkpoint: gradient flows in and out of it.
  Tensor xa = requires_grad_(x0.clone()), xb = requires_grad_(x0.clone());
  backward(sum(pow(body(tanh(xa), p), 2.0)));
  const std::vector<Tensor> plain = grads_of(p.all());
  clear_grads(p.all());

  Tensor y = checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {tanh(xb)});
  EXPECT_TRUE(y.requires_grad());
  EXPECT_STREQ(grad_fn(y)->name(), "CheckpointOutput");
  backward(sum(pow(y, 2.0)));
  expect_all_equal(grads_of(p.all()), plain);
  EXPECT_TRUE(test::all_equal(grad(xb), grad(xa)));
}

TEST(Checkpoint, parameters_get_gradients_when_no_input_requires_grad) {
  const Params p = make_params();
  const Tensor x = test::random_normal({5, kIn}, DType::f64);
  backward(sum(body(x, p)));
  const std::vector<Tensor> plain = grads_of(p.all());
  clear_grads(p.all());

  Tensor y = checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {x});
  backward(sum(y));
  expect_all_equal(grads_of(p.all()), plain);
  EXPECT_FALSE(grad(x).defined());
}

TEST(Checkpoint, a_recompute_that_reaches_no_leaf_returns_no_gradient) {
  // Nothing inside requires grad, but the output carries the node (Note
  // [Activation checkpointing]); the outer leaf gets its share only.
  const Tensor w = test::random_normal({kIn}, DType::f64);
  Tensor x = requires_grad_(test::random_normal({kIn}, DType::f64));
  Tensor y =
      checkpoint([&w](const std::vector<Tensor>& in) { return exp(in[0]) * w; }, {detach(x)});
  EXPECT_TRUE(y.requires_grad());
  backward(sum(y + x));
  EXPECT_TRUE(test::all_equal(grad(x), ones({kIn}, DType::f64)));
}

TEST(Checkpoint, several_outputs_recompute_once_for_all_their_gradients) {
  const Params p = make_params();
  const Tensor x0 = test::random_normal({3, kIn}, DType::f64);
  // h feeds y inside the function and is also used outside: the join must
  // wait for y's contribution to h (dependency counting across the roots).
  auto fn = [&p](const std::vector<Tensor>& in) {
    Tensor h = gelu(linear(in[0], p.w1, p.b1));
    Tensor y = linear(h, p.w2, p.b2) + in[1];
    return std::vector<Tensor>{h, y};
  };
  const Tensor r0 = test::random_normal({3, kIn}, DType::f64);
  auto objective = [](const Tensor& h, const Tensor& y) { return sum(h * h) + sum(exp(y)); };

  Tensor xa = requires_grad_(x0.clone()), ra = requires_grad_(r0.clone());
  std::vector<Tensor> plain_out = fn({xa, ra});
  backward(objective(plain_out[0], plain_out[1]));
  const std::vector<Tensor> plain = grads_of(p.all());
  clear_grads(p.all());

  Tensor xb = requires_grad_(x0.clone()), rb = requires_grad_(r0.clone());
  int calls = 0;
  std::vector<Tensor> out = checkpoint_multi(
      [&](const std::vector<Tensor>& in) {
        ++calls;
        return fn(in);
      },
      {xb, rb});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(calls, 1);
  backward(objective(out[0], out[1]));
  EXPECT_EQ(calls, 2);  // one recompute for both outputs
  expect_all_equal(grads_of(p.all()), plain);
  EXPECT_TRUE(test::all_equal(grad(xb), grad(xa)));
  EXPECT_TRUE(test::all_equal(grad(rb), grad(ra)));
}

TEST(Checkpoint, an_output_that_nothing_uses_contributes_nothing) {
  const Params p = make_params();
  const Tensor x0 = test::random_normal({3, kIn}, DType::f64);
  auto fn = [&p](const std::vector<Tensor>& in) {
    Tensor h = gelu(linear(in[0], p.w1, p.b1));
    return std::vector<Tensor>{h, linear(h, p.w2, p.b2)};
  };
  for (size_t used : {0u, 1u}) {
    Tensor xa = requires_grad_(x0.clone()), xb = requires_grad_(x0.clone());
    backward(sum(exp(fn({xa})[used])));
    const std::vector<Tensor> plain = grads_of(p.all());
    clear_grads(p.all());
    backward(sum(exp(checkpoint_multi(fn, {xb})[used])));
    const std::vector<Tensor> ckpt = grads_of(p.all());
    clear_grads(p.all());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_EQ(plain[i].defined(), ckpt[i].defined()) << "output " << used << " param " << i;
      if (plain[i].defined()) {
        EXPECT_TRUE(test::all_equal(ckpt[i], plain[i]));
      }
    }
    EXPECT_TRUE(test::all_equal(grad(xb), grad(xa))) << "output " << used;
  }
}

TEST(Checkpoint, the_generator_is_rewound_for_the_recompute_and_restored_after) {
  // fn multiplies by fresh random numbers: a recompute that drew new ones
  // would give another gradient.
  const Tensor x0 = test::random_normal({4, kIn}, DType::f64);
  auto fn = [](Generator* gen) {
    return [gen](const std::vector<Tensor>& in) {
      return in[0] * rand(in[0].shape(), DType::f64, Device::cpu(), gen);
    };
  };
  Generator ga(11), gb(11);
  Tensor xa = requires_grad_(x0.clone()), xb = requires_grad_(x0.clone());
  backward(sum(exp(fn(&ga)({xa}))));

  Tensor y = checkpoint(fn(&gb), {xb}, &gb);
  EXPECT_EQ(gb.offset(), ga.offset());  // the forward drew as much as the plain one
  const uint64_t after_forward = gb.offset();
  backward(sum(exp(y)));
  EXPECT_EQ(gb.offset(), after_forward);  // the recompute's draws are not the stream's
  EXPECT_EQ(gb.seed(), 11u);
  EXPECT_TRUE(test::all_equal(grad(xb), grad(xa)));
}

TEST(Checkpoint, dropout_draws_the_forward_masks_in_the_recompute) {
  const Params p = make_params();
  const Tensor x0 = test::random_normal({8, kIn}, DType::f64);
  auto fn = [&p](Generator* gen) {
    return [&p, gen](const std::vector<Tensor>& in) {
      return dropout(body(dropout(in[0], 0.5, true, gen), p), 0.3, true, gen);
    };
  };
  Generator ga(5), gb(5);
  Tensor xa = requires_grad_(x0.clone()), xb = requires_grad_(x0.clone());
  backward(sum(fn(&ga)({xa})));
  const std::vector<Tensor> plain = grads_of(p.all());
  clear_grads(p.all());
  backward(sum(checkpoint(fn(&gb), {xb}, &gb)));
  expect_all_equal(grads_of(p.all()), plain);
  EXPECT_TRUE(test::all_equal(grad(xb), grad(xa)));
  EXPECT_EQ(gb.offset(), ga.offset());
}

TEST(Checkpoint, chained_and_nested_checkpoints_give_the_plain_gradients) {
  const Params p = make_params();
  const Tensor x0 = test::random_normal({3, kIn}, DType::f64);
  auto layer = [&p](const std::vector<Tensor>& in) { return body(in[0], p); };
  Tensor xa = requires_grad_(x0.clone());
  backward(sum(body(body(body(xa, p), p), p)));
  const std::vector<Tensor> plain = grads_of(p.all());
  clear_grads(p.all());

  // Two segments one after the other, the second containing a nested checkpoint:
  // a backward inside a backward inside a backward.
  Tensor xb = requires_grad_(x0.clone());
  Tensor h = checkpoint(layer, {xb});
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) { return checkpoint(layer, {body(in[0], p)}); }, {h});
  backward(sum(y));
  expect_all_equal(grads_of(p.all()), plain);
  EXPECT_TRUE(test::all_equal(grad(xb), grad(xa)));
}

TEST(Checkpoint, parameters_in_an_arena_receive_their_gradients_through_the_sink) {
  auto run = [](bool use_checkpoint) {
    Generator gen(3);
    const Params p = {requires_grad_(randn({kHidden, kIn}, DType::f64, Device::cpu(), &gen)),
                      requires_grad_(randn({kHidden}, DType::f64, Device::cpu(), &gen)),
                      requires_grad_(randn({kIn, kHidden}, DType::f64, Device::cpu(), &gen)),
                      requires_grad_(randn({kIn}, DType::f64, Device::cpu(), &gen)),
                      requires_grad_(randn({kIn}, DType::f64, Device::cpu(), &gen))};
    GradArena arena(p.all(), GradArenaOptions().dtype(DType::f64));
    const Tensor x = randn({4, kIn}, DType::f64, Device::cpu(), &gen);
    arena.begin_window();
    for (int micro = 0; micro < 2; ++micro) {  // the second micro-step adds (beta 1)
      Tensor y =
          use_checkpoint
              ? checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {x})
              : body(x, p);
      backward(sum(exp(y)));
    }
    EXPECT_EQ(arena.zero_unwritten(), 0);
    return arena.grads().clone();
  };
  const Tensor plain = run(false), ckpt = run(true);
  double largest = 0.0;
  for (double v : plain.to_vector<double>())
    largest = std::max(largest, std::fabs(v));
  EXPECT_GT(largest, 0.0);
  EXPECT_TRUE(test::all_equal(ckpt, plain));
}

TEST(Checkpoint, retain_graph_recomputes_again_and_a_freed_graph_throws) {
  const Params p = make_params();
  const Tensor x = test::random_normal({3, kIn}, DType::f64);
  backward(sum(body(x, p)));
  const std::vector<Tensor> once = grads_of(p.all());
  clear_grads(p.all());

  Tensor loss =
      sum(checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {x}));
  backward(loss, Tensor(), /*retain_graph=*/true);
  backward(loss);
  const std::vector<Tensor> twice = grads_of(p.all());
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_TRUE(test::all_equal(twice[i], once[i] * 2.0)) << "param " << i;
  // From the checkpoint's output itself, so that its node is the first freed one reached.
  Tensor y = checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {x});
  const Tensor seed = ones(y.shape(), DType::f64);
  backward(y, seed);
  EXPECT_ERROR(backward(y, seed), "CheckpointBackward", "a second time", "retain_graph");
}

TEST(Checkpoint, without_grad_mode_it_is_just_the_function) {
  const Params p = make_params();
  const Tensor x = test::random_normal({3, kIn}, DType::f64);
  NoGradGuard no_grad;
  Tensor y = checkpoint([&p](const std::vector<Tensor>& in) { return body(in[0], p); }, {x});
  EXPECT_FALSE(grad_fn(y));
  EXPECT_TRUE(test::all_equal(y, body(x, p)));
}

TEST(Checkpoint, integer_outputs_carry_no_gradient) {
  Tensor x = requires_grad_(test::random_normal({4}, DType::f64));
  std::vector<Tensor> out = checkpoint_multi(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{exp(in[0]), full({2}, 3.0, DType::i64)};
      },
      {x});
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  backward(sum(out[0]));
  EXPECT_TRUE(test::all_close(grad(x), exp(detach(x))));
}

TEST(Checkpoint, passes_the_float64_gradcheck) {
  const Params p = make_params();
  std::vector<Tensor> inputs = p.all();
  inputs.push_back(requires_grad_(test::random_normal({2, kIn}, DType::f64)));
  const GradcheckResult r = gradcheck(
      [&p](const std::vector<Tensor>& in) {
        return checkpoint([&p](const std::vector<Tensor>& v) { return body(v[0], p); },
                          {in.back()});
      },
      inputs);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Checkpoint, bad_uses_are_errors) {
  Tensor x = requires_grad_(test::random_normal({3}, DType::f64));
  EXPECT_ERROR(checkpoint(CheckpointFn(), {x}), "checkpoint", "fn is empty");
  EXPECT_ERROR(
      checkpoint_multi([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, {x}),
      "checkpoint", "no tensors");
  EXPECT_ERROR(checkpoint([](const std::vector<Tensor>&) { return Tensor(); }, {x}), "checkpoint",
               "output 0", "undefined");
  // A function whose structure changes between forward and recompute.
  int calls = 0;
  std::vector<Tensor> out = checkpoint_multi(
      [&calls](const std::vector<Tensor>& in) {
        std::vector<Tensor> r{exp(in[0])};
        if (calls++ > 0) r.push_back(exp(in[0]));
        return r;
      },
      {x});
  EXPECT_ERROR(backward(sum(out[0])), "checkpoint", "recompute returned 2", "forward 1");
}

}  // namespace
}  // namespace accrue
