// GradArena: Note [Grad arena] and Note [Overwrite first] on the CPU.
#include "autograd/grad_arena.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

std::vector<Tensor> three_params(DType dtype = DType::f32) {
  return {requires_grad_(test::random_normal({3, 5}, dtype)),
          requires_grad_(test::random_normal({7}, dtype)),
          requires_grad_(test::random_normal({2, 2, 2}, dtype))};
}

TEST(GradArena, slots_are_256_byte_aligned_views_in_registration_order) {
  std::vector<Tensor> params = three_params();
  std::vector<Tensor> before;
  for (const Tensor& p : params)
    before.push_back(p.clone());
  GradArena arena(params, {"a", "b", "c"}, {Device::cpu(), DType::f32, DType::f32, 2});
  ASSERT_EQ(arena.size(), 3u);
  EXPECT_EQ(arena.numel(), 15 + 7 + 8);
  int64_t expected_offset = 0;
  for (size_t i = 0; i < arena.size(); ++i) {
    const GradArena::Slot& s = arena.slots()[i];
    EXPECT_EQ(s.offset, expected_offset) << s.name;
    EXPECT_EQ(s.offset * 4 % 256, 0) << s.name;
    expected_offset += (s.numel + 63) / 64 * 64;
    // The parameter IS its master slot, with its values, and its grad is its gradient slot.
    EXPECT_EQ(params[i].storage(), arena.master().storage());
    EXPECT_EQ(params[i].offset(), s.offset);
    EXPECT_TRUE(test::all_equal(params[i], before[i]));
    EXPECT_EQ(grad(params[i]).storage(), arena.grads().storage());
    EXPECT_EQ(grad(params[i]).offset(), s.offset);
    EXPECT_EQ(arena.index_of(params[i]), static_cast<int>(i));
  }
  EXPECT_EQ(arena.padded_numel(), expected_offset);
  // Padding reads zero in every role (the norm pass and optimizer sweep it).
  const std::vector<float> master = arena.master().to_vector<float>();
  for (int64_t i = 15; i < 64; ++i)
    EXPECT_EQ(master[i], 0.0f);
  EXPECT_EQ(arena.moment(1).to_vector<float>(), std::vector<float>(arena.padded_numel(), 0.0f));
}

// Note [Parameter layouts]: a channels-last parameter keeps its layout in
// every role (the slot holds its elements in N, H, W, C order); the others
// are row-major.
TEST(GradArena, a_channels_last_parameter_keeps_its_layout_in_every_role) {
  const Tensor values = test::random_normal({4, 3, 2, 5}, DType::f32);
  std::vector<Tensor> params = {requires_grad_(test::as_channels_last(values)),
                                requires_grad_(test::random_normal({4, 3, 2, 5}, DType::f32))};
  GradArena arena(params, {"last", "row"}, {Device::cpu(), DType::f32, DType::bf16, 1});
  const Shape last_strides{30, 1, 15, 3};
  EXPECT_EQ(arena.slots()[0].strides, last_strides);
  EXPECT_EQ(arena.slots()[1].strides, contiguous_strides({4, 3, 2, 5}));
  EXPECT_EQ(params[0].strides(), last_strides);
  EXPECT_EQ(arena.master_view(0).strides(), last_strides);
  EXPECT_EQ(arena.grad_view(0).strides(), last_strides);
  EXPECT_EQ(grad(params[0]).strides(), last_strides);
  EXPECT_TRUE(params[1].is_contiguous());
  EXPECT_TRUE(test::all_equal(arena.master_view(0), values));
  EXPECT_TRUE(test::all_equal(params[0], values.to(DType::bf16)));
  // The flat slot holds the elements in channels-last order.
  EXPECT_TRUE(test::all_equal(arena.master().narrow(0, 0, values.numel()),
                              values.permute({0, 2, 3, 1}).contiguous().reshape({120})));
}

TEST(GradArena, compute_copy_repoints_parameters_to_bf16) {
  std::vector<Tensor> params = three_params();
  const Tensor expected = params[0].to(DType::bf16);
  GradArena arena(params, {}, {Device::cpu(), DType::f32, DType::bf16, 0});
  EXPECT_EQ(params[0].dtype(), DType::bf16);
  EXPECT_EQ(params[0].storage(), arena.compute().storage());
  EXPECT_TRUE(test::all_equal(params[0], expected));
  EXPECT_EQ(arena.master().dtype(), DType::f32);
}

TEST(GradArena, first_contribution_writes_later_ones_add_and_unwritten_slots_zero) {
  std::vector<Tensor> params = three_params(DType::f64);
  GradArena arena(params, {}, {Device::cpu(), DType::f64, DType::f64, 0});
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
  EXPECT_ERROR(GradArena({params[0], params[0]}, {}, {}), "GradArena", "registered twice");
  EXPECT_ERROR(GradArena({ones({2})}, {}, {}), "GradArena", "requires grad");
  EXPECT_ERROR(GradArena(params, {"only-one"}, {}), "GradArena", "1 names for 3");
  EXPECT_ERROR(GradArena(params, {}, {Device::cpu(), DType::bf16, DType::bf16, 0}), "master dtype");
  GradArena arena({params[0]}, {}, {Device::cpu(), DType::f32, DType::f32, 0});
  double beta = 0;
  EXPECT_ERROR(arena.claim(params[1], &beta), "GradArena::claim", "not registered");
  EXPECT_ERROR(arena.moment(0), "GradArena::moment", "0 moment arenas");
}

}  // namespace
}  // namespace accrue
