// Fused batch normalization over x [N, C, ...]: per-channel statistics, the
// normalization and its backward in a few passes each, on every backend.
//
// Note [Fused batch norm kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The statistics are the channel's over every dim but 1, biased variance, in
// f32 for f32 and 16-bit inputs and f64 for f64 (Note [BatchNorm in f32]).
// The forward is
//   out = (x - mean) invstd weight + bias,   invstd = 1 / sqrt(var + eps),
// rounded once to x's dtype, and the backward, with xhat = (x - mean) invstd
// and sums over the channel's n values,
//   dbias = sum(g), dweight = sum(g xhat),
//   dx = weight invstd (g - sum(g) / n) - weight invstd^3 sum(g (x - mean)) / n (x - mean).
// x may be contiguous or channels-last (a 4-D NCHW view over NHWC memory):
// both are a dense [outer, C, inner] buffer (channels-last is
// [N H W, C, 1]), and out and dx come back in x's layout, so a channels-last
// model stays channels-last through its BatchNorms; any other layout is made
// contiguous first, and so is a grad whose layout differs from x's.
//   - CPU (the reference): two passes per channel, sums in double in index
//     order, each result rounded once.
//   - CUDA: one pass of per-chunk sums (shifted by the channel's first value,
//     so a channel far from zero keeps its variance), the chunks combined in
//     double in chunk order by a per-channel kernel that also folds weight
//     and bias into a scale and a shift, then one elementwise pass; the
//     backward is the same shape (sums of g and g (x - mean), then dx).
//     Chunk counts follow the shape and the SM count only, so results are
//     bitwise repeatable (Note [Determinism]); 4 launches forward, 3 backward.
#pragma once

#include "accrue/core/tensor.h"

namespace accrue::kernels {

struct BatchNormForward {
  Tensor out;     // x's shape, dtype and layout (contiguous or channels-last)
  Tensor mean;    // [C], f32 (f64 for an f64 x)
  Tensor var;     // [C], biased, the same dtype
  Tensor invstd;  // [C], 1 / sqrt(var + eps), the same dtype
};
// x [N, C, ...] floating with more than one value per channel; weight and
// bias [C] of x's dtype and device; eps > 0.
BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps);

struct BatchNormBackward {
  Tensor dx;       // x's shape, dtype and layout; undefined unless asked for
  Tensor dweight;  // [C], mean's dtype (unrounded to weight's)
  Tensor dbias;    // [C], mean's dtype
};
// grad of x's shape; mean and invstd as batch_norm_forward returned them.
BatchNormBackward batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& invstd, bool need_dx);

// Note [Window statistics]'s merge in one launch: the running (count, mean,
// m2) of a window (f64, [1], [C], [C]) absorb one micro-batch of
// batch_count values per channel with mean batch_mean and biased variance
// batch_var ([C], f32 or f64) by Chan's formula:
//   delta = batch_mean - mean, total = count + batch_count,
//   mean += delta batch_count / total,
//   m2 += batch_var batch_count + delta^2 count batch_count / total,
//   count = total.
void batch_norm_merge_statistics(const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 const Tensor& batch_mean, const Tensor& batch_var,
                                 double batch_count);

// Note [Window statistics]'s close in one launch: where count > 0, the
// running statistics (f64 [C]) move to the pending ones with `momentum` (1:
// replaced outright), the variance unbiased (m2 / (count - 1)):
//   running_mean = running_mean (1 - momentum) + mean momentum,
//   running_var = running_var (1 - momentum) + m2 / (count - 1) momentum;
// then count, mean and m2 are zeroed for the next window. count 0 (no
// forward this window) leaves the running statistics alone, and so do
// pending statistics that are not finite.
//
// Note [Non-finite window statistics]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// When any channel's merged mean or M2 is NaN or infinite (one NaN pixel, a
// forward that overflowed under weights a huge step produced), no channel
// moves: the window's statistics are dropped whole, as a skipped window's
// step is, and the running statistics stay finite. Otherwise one bad batch
// would make every later evaluation NaN, for good, while training itself
// recovers by skipping that window. Checked on the device, inside the same
// launch (a block-wide OR): no host synchronization, and a CUDA graph of the
// close replays it.
void batch_norm_adopt_statistics(const Tensor& running_mean, const Tensor& running_var,
                                 const Tensor& count, const Tensor& mean, const Tensor& m2,
                                 double momentum);

}  // namespace accrue::kernels
