// GradArena: Note [Grad arena] and Note [Overwrite first] on the CPU. The
// optimizer's side of the slots (master, compute copy, moments) is tested in
// tests/optim/param_store_test.cpp.
#include "accrue/autograd/grad_arena.h"

#include <memory>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

std::vector<Tensor> three_params(DType dtype = DType::f32) {
  return {requires_grad_(test::random_normal({3, 5}, dtype)),
          requires_grad_(test::random_normal({7}, dtype)),
          requires_grad_(test::random_normal({2, 2, 2}, dtype))};
}

TEST(GradArena, slots_are_256_byte_aligned_gradient_views_in_registration_order) {
  std::vector<Tensor> params = three_params();
  std::vector<Tensor> before;
  for (const Tensor& p : params)
    before.push_back(detach(p).clone());
  GradArena arena({{"a", params[0]}, {"b", params[1]}, {"c", params[2]}}, GradArenaOptions());
  ASSERT_EQ(arena.size(), 3u);
  EXPECT_EQ(arena.numel(), 15 + 7 + 8);
  int64_t expected_offset = 0;
  for (size_t i = 0; i < arena.size(); ++i) {
    const GradArena::Slot& s = arena.slots()[i];
    EXPECT_EQ(s.offset, expected_offset) << s.name;
    EXPECT_EQ(s.offset * 4 % 256, 0) << s.name;
    expected_offset += (s.numel + 63) / 64 * 64;
    // The gradient is its slot; the parameter's value is not the arena's business.
    EXPECT_NE(params[i].storage(), arena.grads().storage());
    EXPECT_TRUE(test::all_equal(params[i], before[i]));
    EXPECT_EQ(grad(params[i]).storage(), arena.grads().storage());
    EXPECT_EQ(grad(params[i]).offset(), s.offset);
    EXPECT_EQ(arena.index_of(params[i]), static_cast<int>(i));
  }
  EXPECT_EQ(arena.padded_numel(), expected_offset);
  EXPECT_EQ(arena.grads().to_vector<float>(), std::vector<float>(arena.padded_numel(), 0.0f));
}

TEST(GradArena, shard_ranks_pad_every_slot_to_equal_chunks) {
  std::vector<Tensor> params = three_params();
  GradArena arena(params, GradArenaOptions().shard_ranks(3));
  for (const GradArena::Slot& s : arena.slots())
    EXPECT_EQ(s.offset % (3 * 64), 0) << s.name;
  EXPECT_EQ(arena.padded_numel(), 3 * 3 * 64);
}

TEST(GradArena, a_channels_last_parameter_keeps_its_layout) {
  std::vector<Tensor> params = {
      requires_grad_(test::as_channels_last(test::random_normal({4, 3, 2, 5}, DType::f32))),
      requires_grad_(test::random_normal({4, 3, 2, 5}, DType::f32))};
  GradArena arena({{"last", params[0]}, {"row", params[1]}}, GradArenaOptions());
  const Shape last_strides{30, 1, 15, 3};
  EXPECT_EQ(arena.slots()[0].strides, last_strides);
  EXPECT_EQ(arena.slots()[1].strides, contiguous_strides({4, 3, 2, 5}));
  EXPECT_EQ(arena.grad_view(0).strides(), last_strides);
  EXPECT_EQ(grad(params[0]).strides(), last_strides);
}

TEST(GradArena, first_contribution_writes_later_ones_add_and_unwritten_slots_zero) {
  std::vector<Tensor> params = three_params(DType::f64);
  GradArena arena(params, GradArenaOptions().dtype(DType::f64));
  arena.grads().fill_(123.0);  // stale values that a write must replace
  arena.begin_window();
  backward(sum(params[0] * 2.0));
  EXPECT_TRUE(arena.written(0));
  EXPECT_FALSE(arena.written(1));
  EXPECT_TRUE(test::all_equal(arena.grad_view(0), full({3, 5}, 2.0, DType::f64)));
  backward(sum(params[0] * 3.0));
  EXPECT_TRUE(test::all_equal(arena.grad_view(0), full({3, 5}, 5.0, DType::f64)));
  // claim: beta 1 for a written slot, 0 for a fresh one, which it then marks written.
  double beta = -1;
  arena.claim(params[0], &beta);
  EXPECT_EQ(beta, 1.0);
  arena.claim(params[2], &beta);
  EXPECT_EQ(beta, 0.0);
  EXPECT_TRUE(arena.written(2));
  EXPECT_EQ(arena.zero_unwritten(), 1);  // only slot 1 got nothing
  EXPECT_TRUE(test::all_equal(arena.grad_view(1), zeros({7}, DType::f64)));
  arena.begin_window();
  EXPECT_FALSE(arena.written(0));
}

TEST(GradArena, bad_registrations_are_errors) {
  std::vector<Tensor> params = three_params();
  EXPECT_ERROR(GradArena({params[0], params[0]}, {}), "GradArena", "registered twice");
  EXPECT_ERROR(GradArena({ones({2})}, {}), "GradArena", "requires grad");
  EXPECT_ERROR(GradArena(params, GradArenaOptions().dtype(DType::bf16)), "gradient dtype");
  EXPECT_ERROR(GradArena(params, GradArenaOptions().shard_ranks(0)), "shard_ranks");
  EXPECT_ERROR(GradArena(std::vector<Tensor>{}), "GradArena", "no parameters");
  GradArena arena({params[0]}, GradArenaOptions());
  double beta = 0;
  EXPECT_ERROR(arena.claim(params[1], &beta), "GradArena::claim", "not registered");
  EXPECT_ERROR(arena.set_written_flags({true, false}), "set_written_flags", "2 flags for 1");
}

// Note [One owner]: a second arena over a held parameter is refused, naming
// the parameter and its holder, and the first keeps its gradients.
TEST(GradArena, a_parameter_held_by_one_arena_cannot_join_another) {
  std::vector<Tensor> params = three_params(DType::f64);
  auto first = std::make_unique<GradArena>(
      std::vector<NamedParameter>{{"a", params[0]}, {"b", params[1]}, {"c", params[2]}},
      GradArenaOptions().dtype(DType::f64).name("model"));
  const auto other = GradArenaOptions().dtype(DType::f64).name("second");
  EXPECT_ERROR(GradArena({{"w", params[1]}}, other), "GradArena 'second'", "parameter 'w'",
               "already held by the gradient arena 'model' (3 parameters), as its 'b'",
               "Note [One owner]");
  // Refused before anything changed: the first arena still gets the gradients.
  first->begin_window();
  backward(sum(params[1] * 3.0));
  EXPECT_TRUE(first->written(1));
  for (double g : first->grad_view(1).to_vector<double>())
    EXPECT_EQ(g, 3.0);
  // Once the holder is gone the parameter is free.
  first.reset();
  GradArena second({{"w", params[1]}}, other);
  EXPECT_EQ(second.index_of(params[1]), 0);
}

// Note [One owner]: gradcheck says where an arena-held input's gradient goes
// instead of reporting "analytic 0 vs numeric ...".
TEST(GradArena, gradcheck_of_an_arena_held_parameter_says_where_its_gradient_goes) {
  const Tensor w = requires_grad_(test::random_normal({3}, DType::f64));
  const auto f = [](const std::vector<Tensor>& v) { return v[0] * v[0]; };
  {
    GradArena arena({{"fc.weight", w}}, GradArenaOptions().dtype(DType::f64).name("model"));
    EXPECT_ERROR(gradcheck(f, {w}), "gradcheck: input 0 of shape [3]",
                 "held by the gradient arena 'model' (1 parameter), as its 'fc.weight'",
                 "lands in that arena's slot", "requires_grad_(detach(p).clone())");
    // The advice works while the arena holds w.
    const Tensor fresh = requires_grad_(detach(w).clone());
    EXPECT_GRADCHECK(f, fresh);
  }
  EXPECT_GRADCHECK(f, w);  // released: an ordinary leaf again
}

TEST(GradArena, clear_grad_of_an_arena_held_parameter_is_refused) {
  const Tensor w = requires_grad_(test::random_normal({3}, DType::f64));
  GradArena arena({{"w", w}}, GradArenaOptions().dtype(DType::f64));
  EXPECT_ERROR(clear_grad(w), "clear_grad", "held by the gradient arena", "'w'",
               "nothing to clear");
  EXPECT_EQ(grad(w).storage(), arena.grads().storage());  // still the slot
}

}  // namespace
}  // namespace accrue
