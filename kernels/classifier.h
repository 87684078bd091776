// The fused classifier: logits GEMM -> cross-entropy (sum, count) -> dlogits,
// without the fp32 [tokens x vocab] logits or softmax ever existing.
//
// Note [Fused classifier]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Forward runs over chunks of token rows (Note [Classifier chunk rows] in
// kernels/classifier.cpp): each chunk's logits come from one GEMM in the
// compute dtype (fp32 accumulate) into the chunk's rows of the dlogits
// buffer, then one kernel per chunk computes each row's log-sum-exp over the
// first valid_classes columns in fp32 (f64 for f64), writes the row's loss
// lse - logit[target] (0 for an ignored row) to a per-row array, and
// overwrites the row with d(loss_sum)/d(logits) = softmax - onehot (0 in the
// padded columns and in ignored rows). One last kernel adds the row losses in
// row order (fixed-order partials, no float atomics) and counts the rows
// whose target is not ignore_index. The buffer is [N, padded_classes] in the
// compute dtype: for bf16 at 32 x 1024 tokens and 50304 classes, 3.3 GB
// instead of 6.6 GB of fp32 logits and 6.6 GB more of softmax.
//
// Backward only multiplies, with the seed g (the 0-d d(objective)/d(sum), a
// loss scale on the device) never read on the host:
//   dW (= or +=) dlogits^T @ (g * h): g * h is a small [N, D] pass rounded
//     once to the compute dtype, and the GEMM writes the weight gradient
//     straight into its destination (an fp32 arena slot with beta 0 on the
//     window's first contribution and 1 after: Note [Fused weight-gradient
//     accumulation] in autograd/sink_target.h);
//   dh = g * (dlogits @ W): the product in fp32 for bf16/f16, then scaled and
//     rounded once.
// The padded rows of W receive exactly 0 (their dlogits columns are 0).
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

struct ClassifierOutput {
  Tensor sum;      // 0-d: the summed loss, f32 (f64 for f64)
  Tensor count;    // 0-d i64: rows whose target != ignore_index
  Tensor dlogits;  // [N, V_padded], hidden's dtype: d(sum)/d(logits)
};
// hidden [N, D], weight [V_padded, D] (same float dtype), targets [N] i32/i64 in
// [0, valid_classes) or ignore_index. 0 < valid_classes <= V_padded; columns
// past it are padding: excluded from the softmax, their dlogits 0.
ClassifierOutput classifier_forward(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& targets, int64_t valid_classes,
                                    int64_t ignore_index = -100);

// The backward of classifier_forward for the seed grad_sum (0-d, any float
// dtype, on hidden's device). Returns dh = grad_sum * dlogits @ weight ([N, D],
// hidden's dtype) when need_dh, else an undefined tensor. When dweight is
// defined ([V_padded, D], weight's dtype or f32 next to bf16/f16: an arena
// slot), writes (beta 0) or adds (beta 1) grad_sum * dlogits^T @ hidden into it.
Tensor classifier_backward(const Tensor& dlogits, const Tensor& hidden, const Tensor& weight,
                           const Tensor& grad_sum, bool need_dh, const Tensor& dweight,
                           double beta);

}  // namespace accrue::kernels
