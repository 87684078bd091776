// The equivalence suite on the CPU reference backend: master and compute in
// f64, where "equal" means max|a - b| <= 1e-12 max|b| per parameter slot for
// one window's gradient and 1e-10 for the parameters after 20 windows.
#include "tests/equivalence/equivalence_checks.h"
#include "tests/test_util.h"

namespace accrue::equivalence {
namespace {

TEST(EquivalenceCpu, accumulated_equals_full_batch_mlp) {
  check_accumulated_equals_full_batch(ModelKind::Classifier, cpu_f64());
}

TEST(EquivalenceCpu, accumulated_equals_full_batch_lm) {
  check_accumulated_equals_full_batch(ModelKind::LM, cpu_f64());
}

TEST(EquivalenceCpu, item_count_normalization_is_exact_for_padded_micro_batches) {
  check_item_count_normalization_is_exact_for_padded_micro_batches(cpu_f64());
}

TEST(EquivalenceCpu, skipped_window_leaves_state_bitwise_unchanged) {
  check_skipped_window_leaves_state_bitwise_unchanged(cpu_f64());
}

TEST(EquivalenceCpu, clipping_applies_once_to_the_window_gradient) {
  check_clipping_applies_once_to_the_window_gradient(cpu_f64());
}

TEST(EquivalenceCpu, unused_parameter_reads_zero) {
  check_unused_parameter_reads_zero(cpu_f64());
}

TEST(EquivalenceCpu, tied_parameter_accumulates_both_uses) {
  check_tied_parameter_accumulates_both_uses(cpu_f64());
}

// bf16 compute on the CPU backend (bf16 storage, f32 math) with an f32 arena.
TEST(EquivalenceCpu, bf16_compute_with_fp32_arena_error_does_not_grow_with_K) {
  Precision p = cpu_f64();
  p.name = "cpu-bf16";
  p.dtype = DType::f32;
  check_bf16_compute_with_fp32_arena_error_does_not_grow_with_K(p);
}

TEST(EquivalenceCpu, windows_are_bitwise_reproducible) {
  check_windows_are_bitwise_reproducible(cpu_f64());
}

TEST(EquivalenceCpu, arena_backward_allocates_no_weight_gradient_temporary) {
  check_arena_backward_allocates_no_weight_gradient_temporary(cpu_f64());
}

}  // namespace
}  // namespace accrue::equivalence
