// classifier_cross_entropy (Note [Fused classifier]): the float64 gradcheck,
// gradients equal to the unfused graph, the seed, and the gradient arena.
#include <cmath>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::leaf;

// Targets in [0, valid) with every third one ignore_index.
Tensor some_ignored_targets(const Shape& shape, int64_t valid, int64_t ignore) {
  std::vector<int64_t> t =
      test::random_integers(shape, 0, static_cast<int>(valid - 1), DType::i64).to_vector<int64_t>();
  for (size_t i = 1; i < t.size(); i += 3)
    t[i] = ignore;
  return from_vector(t, shape, DType::i64);
}

// The unfused reference: cross_entropy(matmul(h, W^T)[..., :valid]).
Loss unfused(const Tensor& hidden, const Tensor& weight, const Tensor& targets, int64_t valid,
             int64_t ignore) {
  const int64_t d = hidden.size(-1);
  const Tensor h2 = reshape(hidden, {-1, d});
  const Tensor logits = narrow(matmul(h2, transpose(weight, 0, 1)), 1, 0, valid);
  return cross_entropy(logits, targets.reshape({-1}), ignore);
}

TEST(ClassifierGradcheck, hidden_and_weight_with_padding_and_ignored_rows) {
  const int64_t d = 4, padded = 9, valid = 7, ignore = -100;
  const Tensor targets = some_ignored_targets({2, 3}, valid, ignore);
  GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& v) {
        return classifier_cross_entropy(v[0], v[1], targets, valid, ignore).sum;
      },
      {leaf({2, 3, d}), leaf({padded, d}, 0.7)});
  EXPECT_TRUE(r.ok) << r.message;
  // Without padding, i32 targets and an ignore_index that is also a class.
  const Tensor t32 = some_ignored_targets({5}, 6, 2).to(DType::i32);
  r = gradcheck(
      [&](const std::vector<Tensor>& v) {
        return classifier_cross_entropy(v[0], v[1], t32, 6, 2).sum;
      },
      {leaf({5, 3}), leaf({6, 3})});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ClassifierGradcheck, gradients_equal_the_unfused_graph) {
  const int64_t d = 6, padded = 16, valid = 13, ignore = -1;
  const Tensor targets = some_ignored_targets({3, 4}, valid, ignore);
  const Tensor h = leaf({3, 4, d}), w = leaf({padded, d}, 0.5);
  const Tensor h_ref = requires_grad_(detach(h).clone()), w_ref = requires_grad_(detach(w).clone());
  const Loss fused = classifier_cross_entropy(h, w, targets, valid, ignore);
  const Loss plain = unfused(h_ref, w_ref, targets, valid, ignore);
  EXPECT_EQ(fused.count.dtype(), DType::i64);
  EXPECT_EQ(fused.count.item(), plain.count.item());
  EXPECT_EQ(fused.sum.dtype(), DType::f64);
  EXPECT_NEAR(fused.sum.item(), plain.sum.item(), 1e-12 * std::fabs(plain.sum.item()));
  // A seed as the Window gives one (a loss scale on the device), here 0.25.
  backward(fused.sum, scalar_tensor(0.25, DType::f64));
  backward(plain.sum, scalar_tensor(0.25, DType::f64));
  EXPECT_EQ(grad(h).shape(), h.shape());
  EXPECT_TRUE(test::all_close(grad(h), grad(h_ref), 1e-12, 1e-14));
  EXPECT_TRUE(test::all_close(grad(w), grad(w_ref), 1e-12, 1e-14));
  // The padded rows of the weight get exactly 0.
  EXPECT_TRUE(test::all_equal(grad(w).narrow(0, valid, padded - valid),
                              zeros({padded - valid, d}, DType::f64)));
}

TEST(ClassifierGradcheck, only_the_inputs_that_require_grad_get_one) {
  const Tensor targets = some_ignored_targets({5}, 4, -100);
  const Tensor h = leaf({5, 3});
  const Tensor w = test::random_normal({4, 3}, DType::f64);  // frozen
  backward(classifier_cross_entropy(h, w, targets, 4).sum / 5.0);
  EXPECT_TRUE(grad(h).defined());
  EXPECT_FALSE(grad(w).defined());
  const Tensor h_ref = requires_grad_(detach(h).clone());
  backward(unfused(h_ref, w, targets, 4, -100).sum / 5.0);
  EXPECT_TRUE(test::all_close(grad(h), grad(h_ref), 1e-12, 1e-14));
  // Without grad mode nothing is recorded (and dlogits is dropped at once).
  NoGradGuard no_grad;
  const Loss loss = classifier_cross_entropy(h, w, targets, 4);
  EXPECT_FALSE(loss.sum.requires_grad());
  EXPECT_EQ(grad_fn(loss.sum), nullptr);
}

// Note [Fused weight-gradient accumulation] through the arena: the first
// backward of a window writes the weight's slot, the next one adds, and a
// weight also used by an embedding (GPT-2's tied embedding) gets both
// contributions, whichever order they come in.
TEST(ClassifierGradcheck, arena_slot_is_written_then_accumulated) {
  const int64_t d = 5, padded = 12, valid = 10;
  const Tensor w0 = test::random_normal({padded, d}, DType::f64);
  const Tensor h0 = test::random_normal({7, d}, DType::f64);
  const Tensor targets = some_ignored_targets({7}, valid, -100);
  const Tensor indices = test::random_integers({7}, 0, static_cast<int>(valid - 1), DType::i64);
  const double seed = 0.5;

  // The reference: plain leaves, .grad.
  const Tensor w_ref = requires_grad_(w0.clone());
  const Tensor h_ref = requires_grad_(h0.clone());
  backward(classifier_cross_entropy(h_ref, w_ref, targets, valid).sum,
           scalar_tensor(seed, DType::f64));
  const Tensor dw_once = grad(w_ref).clone();
  const Tensor w_tied_ref = requires_grad_(w0.clone());
  backward(
      classifier_cross_entropy(embedding(w_tied_ref, indices) + h0, w_tied_ref, targets, valid).sum,
      scalar_tensor(seed, DType::f64));

  const Tensor w = requires_grad_(w0.clone());
  GradArena arena({{"classifier", w}}, GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(123.0);  // stale values that the first write must replace
  arena.begin_window();
  const Tensor h = requires_grad_(h0.clone());
  backward(classifier_cross_entropy(h, w, targets, valid).sum, scalar_tensor(seed, DType::f64));
  EXPECT_TRUE(arena.written(0));
  EXPECT_TRUE(test::all_close(arena.grad_view(0), dw_once, 1e-12, 1e-14));
  EXPECT_TRUE(test::all_close(grad(h), grad(h_ref), 1e-12, 1e-14));
  backward(classifier_cross_entropy(h, w, targets, valid).sum, scalar_tensor(seed, DType::f64));
  EXPECT_TRUE(test::all_close(arena.grad_view(0),
                              kernels::binary_scalar(kernels::BinaryOp::Mul, dw_once, 2.0), 1e-12,
                              1e-14));
  // Tied: the embedding and the classifier both write into the one slot.
  arena.begin_window();
  backward(classifier_cross_entropy(embedding(w, indices) + h0, w, targets, valid).sum,
           scalar_tensor(seed, DType::f64));
  EXPECT_TRUE(test::all_close(arena.grad_view(0), grad(w_tied_ref), 1e-12, 1e-14));
}

TEST(ClassifierGradcheck, bad_inputs_throw_naming_op_and_values) {
  const Tensor h = leaf({2, 3, 4}), w = leaf({6, 4});
  EXPECT_ERROR(classifier_cross_entropy(h, w, zeros({3, 2}, DType::i64), 5),
               "classifier_cross_entropy", "targets of shape [3, 2]", "[2, 3, 4]", "[2, 3]");
  EXPECT_ERROR(
      classifier_cross_entropy(scalar_tensor(1.0, DType::f64), w, zeros({}, DType::i64), 5),
      "classifier_cross_entropy", "0-d");
  EXPECT_ERROR(classifier_cross_entropy(h, w, zeros({2, 3}, DType::i64), 7), "classifier_forward",
               "valid_classes 7", "[1, 6]");
  EXPECT_ERROR(classifier_cross_entropy(h, leaf({6, 5}), zeros({2, 3}, DType::i64), 5),
               "classifier_forward", "weight of shape [6, 5]");
  EXPECT_ERROR(classifier_cross_entropy(h, w, full({2, 3}, 5.0, DType::i64), 5),
               "classifier_forward", "target 5", "[0, 5)");
}

}  // namespace
}  // namespace accrue
