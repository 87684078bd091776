// Differentiable convolution and pooling over NCHW tensors (kernels/conv.h:
// the CPU reference so far). Weight gradients land in the arena slot
// directly when the weight has one (Note [Fused weight-gradient accumulation]).
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"
#include "accrue/kernels/conv.h"

namespace accrue {

// x [N, C, H, W], weight [O, C / groups, KH, KW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options = {});
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
// x [N, C, ...]: each sample's C channels in `groups` groups of C / groups,
// each normalized over its channels and every position (biased variance, eps
// inside the root), then scaled by weight and shifted by bias ([C] each, or
// undefined), as torch.nn.functional.group_norm. Composed from the
// differentiable ops, so it runs on every device; 16-bit inputs keep their
// statistics in f32.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);

// Training-mode batch normalization of x [N, C, ...] over every dim but 1:
// (x - mean) / sqrt(var + eps) * weight + bias, var biased, weight and bias
// [C] of x's dtype. One autograd node (Note [Fused batch norm]).
struct BatchNormResult {
  Tensor out;   // x's shape and dtype
  Tensor mean;  // [C], f32 (f64 for an f64 input), no gradient
  Tensor var;   // [C], biased, the same
};
BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

}  // namespace accrue
