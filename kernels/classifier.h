// The fused classifier: logits GEMM -> cross-entropy (sum, count) -> dlogits,
// without the fp32 [tokens x vocab] logits or softmax ever existing.
//
// Note [Fused classifier]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Forward runs over chunks of token rows: each chunk's logits come from one
// GEMM in the compute dtype (fp32 accumulate) into the chunk's rows of the
// dlogits buffer, then one kernel per chunk computes each row's log-sum-exp
// over the first valid_classes columns in fp32, adds the row's loss to fixed-
// order partials, and overwrites the row with d(loss_sum)/d(logits) =
// softmax - onehot (0 in the padded columns and in ignored rows). Backward
// only multiplies: dh = seed * dlogits @ W and dW (+)= seed * dlogits^T h.
// The buffer is [N, padded_classes] in the compute dtype: for bf16 at 32 x
// 1024 tokens and 50304 classes, 3.3 GB instead of 6.6 GB of fp32 logits and
// 6.6 GB more of softmax.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace accrue::kernels {

struct ClassifierOutput {
  Tensor sum;      // 0-d: the summed loss, f32 (f64 for f64)
  Tensor count;    // 0-d i64: rows whose target != ignore_index
  Tensor dlogits;  // [N, V_padded], hidden's dtype: d(sum)/d(logits)
};
// hidden [N, D], weight [V_padded, D] (same float dtype), targets [N] i32/i64 in
// [0, valid_classes) or ignore_index. valid_classes <= V_padded; columns past
// it are padding: excluded from the softmax, their dlogits 0.
ClassifierOutput classifier_forward(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& targets, int64_t valid_classes,
                                    int64_t ignore_index = -100);

}  // namespace accrue::kernels
