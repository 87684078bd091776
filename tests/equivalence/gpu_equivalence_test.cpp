// The equivalence suite on CUDA: master and compute in f32 with TF32 off,
// where "equal" means ||a - b|| / ||b|| <= 1e-6 for one window's gradient and
// 1e-5 for the parameters after 20 windows. Every test skips without a GPU.
#include "tests/equivalence/equivalence_checks.h"
#include "tests/test_util.h"

namespace accrue::equivalence {
namespace {

TEST(EquivalenceGpu, accumulated_equals_full_batch_mlp) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_accumulated_equals_full_batch(ModelKind::Classifier, cuda_f32());
}

TEST(EquivalenceGpu, accumulated_equals_full_batch_lm) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_accumulated_equals_full_batch(ModelKind::LM, cuda_f32());
}

TEST(EquivalenceGpu, item_count_normalization_is_exact_for_padded_micro_batches) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_item_count_normalization_is_exact_for_padded_micro_batches(cuda_f32());
}

TEST(EquivalenceGpu, skipped_window_leaves_state_bitwise_unchanged) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_skipped_window_leaves_state_bitwise_unchanged(cuda_f32());
}

TEST(EquivalenceGpu, clipping_applies_once_to_the_window_gradient) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_clipping_applies_once_to_the_window_gradient(cuda_f32());
}

TEST(EquivalenceGpu, unused_parameter_reads_zero) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_unused_parameter_reads_zero(cuda_f32());
}

TEST(EquivalenceGpu, tied_parameter_accumulates_both_uses) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_tied_parameter_accumulates_both_uses(cuda_f32());
}

TEST(EquivalenceGpu, bf16_compute_with_fp32_arena_error_does_not_grow_with_K) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  Precision p = cuda_f32();
  p.name = "cuda-bf16";
  check_bf16_compute_with_fp32_arena_error_does_not_grow_with_K(p);
}

TEST(EquivalenceGpu, windows_are_bitwise_reproducible) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_windows_are_bitwise_reproducible(cuda_f32());
}

TEST(EquivalenceGpu, arena_backward_allocates_no_weight_gradient_temporary) {
  ACCRUE_REQUIRE_CUDA();
  const TF32Off tf32_off;
  check_arena_backward_allocates_no_weight_gradient_temporary(cuda_f32());
}

}  // namespace
}  // namespace accrue::equivalence
