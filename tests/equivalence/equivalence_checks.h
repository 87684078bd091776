// The properties of the equivalence suite, each one check that asserts it
// (with GoogleTest EXPECT/ASSERT) for a given precision. cpu_*_test.cpp runs
// them in f64 on the CPU reference backend, gpu_*_test.cpp in f32 on CUDA.
// Each check prints what it measured, prefixed "[equivalence]".
#pragma once

#include "tests/equivalence/equivalence_util.h"

namespace accrue::equivalence {

// 1. K micro-batches (K = 1, 2, 4, 8, 16, global batch 32) give the K = 1
//    gradient after one window, and the K = 1 parameters after 20 windows of
//    AdamW with active clipping.
void check_accumulated_equals_full_batch(ModelKind kind, const Precision& p);

// 2. Padded variable-length micro-batches: ItemCount normalization gives the
//    full-batch update; the legacy mean of micro-batch means measurably does not.
void check_item_count_normalization_is_exact_for_padded_micro_batches(const Precision& p);

// 3. A non-finite gradient in micro-batch j (each j of K = 4) skips the window:
//    master, moments and the step count bitwise unchanged, the dynamic scale
//    halved; the following windows equal a run that never saw the bad batch.
void check_skipped_window_leaves_state_bitwise_unchanged(const Precision& p);

// 4. Clipping applies once, to the window's total gradient: equal to clipping
//    the K = 1 gradient by hand, and different from summing per-micro-batch
//    clipped gradients.
void check_clipping_applies_once_to_the_window_gradient(const Precision& p);

// 5a. A parameter unused in window 2 (used in window 1) reads exactly 0 after
//     window 2's close; the used ones hold window 2's gradient only.
void check_unused_parameter_reads_zero(const Precision& p);
// 5b. A weight used as the embedding table and as the output projection gets
//     the sum of both contributions (the untied copies' gradients summed).
void check_tied_parameter_accumulates_both_uses(const Precision& p);

// 6. With bf16 compute and the fp32 arena, the accumulated gradient's error
//    against an f64 CPU reference does not grow with K (K = 64 within 1.5x of
//    K = 1); a bf16 accumulation buffer's does. p.dtype must be f32.
void check_bf16_compute_with_fp32_arena_error_does_not_grow_with_K(const Precision& p);

// 7. Two runs of the same windows (fresh arenas, same seeds) are bitwise
//    identical: gradients, parameters, moments and window state.
void check_windows_are_bitwise_reproducible(const Precision& p);

// 8. Note [Fused weight-gradient accumulation]: with the arena, a backward
//    through Linear layers allocates exactly one tensor fewer per weight and
//    per bias than the same backward into plain .grad storage.
void check_arena_backward_allocates_no_weight_gradient_temporary(const Precision& p);

}  // namespace accrue::equivalence
