// Tensor geometry, raw views, copies and factories on the CPU.
#include <gmock/gmock.h>

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;

TEST(Tensor, factories_have_contiguous_geometry) {
  Tensor t = empty({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_TRUE(t.device().is_cpu());
}

TEST(Tensor, zero_dim_tensor_has_one_element) {
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 3.5);
}

TEST(Tensor, empty_tensor_has_no_elements_and_copies) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.clone().shape(), (Shape{0, 3}));
  EXPECT_TRUE(e.to_vector<float>().empty());
}

TEST(Tensor, full_ones_arange_values) {
  EXPECT_EQ(full({3}, 2.5).to_vector<float>(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
  EXPECT_EQ(ones({2}, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(arange(0, 5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::f64).to_vector<double>(),
            (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(3, 0).numel(), 0);
}

TEST(Tensor, transpose_is_a_view_with_swapped_strides) {
  Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.strides(), (Shape{1, 3}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  EXPECT_EQ(tt.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(tt.contiguous().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(tt.contiguous().is_contiguous());
}

TEST(Tensor, view_and_reshape) {
  Tensor t = arange(0, 12, 1, DType::f32).view({3, 4});
  EXPECT_EQ(t.view({-1}).shape(), (Shape{12}));
  EXPECT_EQ(t.view({2, -1, 2}).shape(), (Shape{2, 3, 2}));
  // A transposed tensor cannot be flattened without a copy; reshape copies.
  Tensor tt = t.transpose(0, 1);
  EXPECT_ERROR(tt.view({12}), "view", "[4, 3]");
  EXPECT_EQ(tt.reshape({12}).to_vector<float>(),
            (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_ERROR(t.view({5, -1}), "view", "[5, -1]", "12");
  EXPECT_ERROR(t.view({-1, -1}), "more than one -1");
}

TEST(Tensor, narrow_select_offsets) {
  Tensor t = arange(0, 12, 1, DType::f32).view({3, 4});
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{3, 2}));
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(n.to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor row = t.select(0, -1);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
  EXPECT_ERROR(t.narrow(1, 3, 2), "narrow", "[3, 5)", "[3, 4]");
  EXPECT_ERROR(t.select(0, 3), "select", "index 3");
  EXPECT_ERROR(t.narrow(2, 0, 1), "narrow", "dim 2");
}

TEST(Tensor, expand_uses_zero_strides) {
  Tensor col = from_vector<float>({1, 2, 3}, {3, 1});
  Tensor e = col.expand({3, 4});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  Tensor lead = from_vector<float>({1, 2}, {2}).expand({2, 2});
  EXPECT_EQ(lead.to_vector<float>(), (std::vector<float>{1, 2, 1, 2}));
  EXPECT_ERROR(col.expand({2, 4}), "expand", "[3, 1]", "[2, 4]");
}

TEST(Tensor, permute_unsqueeze_squeeze) {
  Tensor t = arange(0, 24, 1, DType::f32).view({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.contiguous().view({-1}).to_vector<float>()[1], 4.0f);
  EXPECT_EQ(t.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3, 4}));
  EXPECT_ERROR(t.squeeze(0), "squeeze", "size 2");
  EXPECT_ERROR(t.permute({0, 0, 1}), "permute", "repeated");
}

TEST(Tensor, copy_broadcasts_and_casts) {
  Tensor dst = zeros({2, 3}, DType::f64);
  dst.copy_(from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  // Into a strided view: only the view's elements change.
  Tensor big = zeros({3, 3});
  big.narrow(1, 1, 1).copy_(full({3, 1}, 7));
  EXPECT_EQ(big.to_vector<float>(), (std::vector<float>{0, 7, 0, 0, 7, 0, 0, 7, 0}));
  EXPECT_ERROR(dst.copy_(zeros({4})), "copy_", "[4]", "[2, 3]");
}

TEST(Tensor, casts_round_trip_between_float_dtypes) {
  Tensor x = from_vector<double>({1.0, -2.5, 0.15625, 65504.0, 1e-3}, {5});
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<double> back = x.to(d).to(DType::f64).to_vector<double>();
    std::vector<double> orig = x.to_vector<double>();
    for (size_t i = 0; i < orig.size(); ++i) {
      const double tol = d == DType::bf16 ? 4e-3 : (d == DType::f16 ? 5e-4 : 1e-7);
      EXPECT_NEAR(back[i], orig[i], tol * std::fabs(orig[i])) << dtype_name(d) << " element " << i;
    }
  }
  EXPECT_EQ(from_vector<float>({1.7f, -1.7f}, {2}).to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(from_vector<float>({0.0f, 2.0f}, {2}).to(DType::boolean).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1}));
}

TEST(Tensor, item_requires_one_element) {
  EXPECT_ERROR(zeros({2}).item(), "item", "[2]");
}

TEST(Tensor, from_vector_checks_size) {
  EXPECT_ERROR(from_vector<float>({1, 2, 3}, {2, 2}), "from_vector", "3 values", "[2, 2]");
}

TEST(Tensor, cuda_tensor_without_device_is_an_error) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(empty({2}, DType::f32, Device::cuda(0)), Error);
}

TEST(Tensor, raw_views_refuse_tensors_that_require_grad) {
  Tensor w = requires_grad_(ones({2, 3}));
  EXPECT_ERROR(w.view({6}), "view", "accrue::view");
  EXPECT_ERROR(w.transpose(0, 1), "transpose");
  NoGradGuard no_grad;
  EXPECT_EQ(w.view({6}).numel(), 6);  // allowed when no graph is recorded
}

TEST(Tensor, make_view_checks_bounds) {
  Tensor base = zeros({10});
  EXPECT_EQ(make_view(base, {2, 2}, {2, 1}, 6).to_vector<float>().size(), 4u);
  EXPECT_ERROR(make_view(base, {2, 3}, {3, 1}, 5), "make_view", "exceeds");
}

TEST(Allocator, counts_current_and_peak_bytes) {
  const Device cpu = Device::cpu();
  const MemoryStats before = memory_stats(cpu);
  reset_peak_memory(cpu);
  {
    Tensor a = empty({1000}, DType::f64);
    EXPECT_EQ(memory_stats(cpu).current_bytes, before.current_bytes + 8000);
  }
  EXPECT_EQ(memory_stats(cpu).current_bytes, before.current_bytes);
  EXPECT_GE(memory_stats(cpu).peak_bytes, before.current_bytes + 8000);
}

TEST(Broadcast, shapes_follow_numpy_rules) {
  EXPECT_EQ(broadcast_shapes({3, 1}, {4}, "t"), (Shape{3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {2, 2}, "t"), (Shape{2, 2}));
  EXPECT_EQ(broadcast_shapes({5, 1, 3}, {4, 1}, "t"), (Shape{5, 4, 3}));
  EXPECT_ERROR(broadcast_shapes({2, 3}, {4}, "myop"), "myop", "[2, 3]", "[4]");
}

}  // namespace
}  // namespace accrue
