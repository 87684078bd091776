// The backend side of the fused classifier (kernels/classifier.h): what
// kernels/cpu/classifier.cpp and kernels/cuda/classifier.cu implement.
// Private to kernels/. kernels/classifier.cpp has validated everything and
// allocated every output; rows > 0 and numel > 0 wherever a function is called.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace accrue::kernels {

namespace cpu {
// logits: contiguous [rows, padded] holding one chunk's logits, overwritten
// with softmax - onehot over the first valid_classes columns (0 after them and
// in ignored rows); targets contiguous [rows], i32/i64, each in
// [0, valid_classes) or ignore_index; row_loss contiguous [rows], f32 (f64 for
// f64): lse - logit[target], 0 for an ignored row.
void classifier_rows(const Tensor& logits, const Tensor& targets, int64_t valid_classes,
                     int64_t ignore_index, const Tensor& row_loss);
// sum (0-d, row_loss's dtype) = the row losses added in row order; count (0-d
// i64) = the targets that are not ignore_index.
void classifier_total(const Tensor& row_loss, const Tensor& targets, int64_t ignore_index,
                      const Tensor& sum, const Tensor& count);
// out = x * seed in out's math type (fp32, f64 for f64), rounded once; x and
// out contiguous with the same numel (x may be out itself), x of out's dtype
// or f32; seed 0-d f32 (f64 for f64).
void scale_by_seed(const Tensor& x, const Tensor& seed, const Tensor& out);
}  // namespace cpu

namespace cuda {
void classifier_rows(const Tensor& logits, const Tensor& targets, int64_t valid_classes,
                     int64_t ignore_index, const Tensor& row_loss);
void classifier_total(const Tensor& row_loss, const Tensor& targets, int64_t ignore_index,
                      const Tensor& sum, const Tensor& count);
void scale_by_seed(const Tensor& x, const Tensor& seed, const Tensor& out);
}  // namespace cuda

}  // namespace accrue::kernels
