// The backend side of attention (kernels/attention.h): the functions that
// kernels/cpu/attention.cpp and kernels/cuda/attention.cu implement (listed
// in kernels/attention_functions.inc) and kernels/cuda/attention_cudnn.cpp
// implements, and the rules all of them share. Private to kernels/.
//
// kernels/attention.cpp has validated every tensor and chosen the path (Note
// [Attention paths]) before a backend is called: q [B, H, Tq, d], k [B, H, Tk,
// d], v [B, H, Tk, dv], out and grad_out [B, H, Tq, dv], dq/dk/dv shaped like
// q/k/v, all of one floating dtype on one device, any strides whose last is
// 1; lse contiguous [B, H, Tq] of the statistics dtype (f32, f64 for f64);
// every extent >= 1.
#pragma once

#include <cstdint>

#include "accrue/core/host_device.h"
#include "accrue/core/philox.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// One attention problem, options resolved (the scale is never defaulted here).
struct AttentionParams {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, d = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;
  double dropout_p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Note [Attention masks]
// ~~~~~~~~~~~~~~~~~~~~~~
// Causal: query i sees key j iff j <= i + (Tk - Tq) (aligned to the bottom
// right, as kernels/attention.h says). Dispatch requires Tq <= Tk when
// causal, so every query row sees at least key 0 and its log-sum-exp is
// finite: no row is ever fully masked, and no backend needs a rule for one.
//
// Dropout on the probabilities: element (b, h, i, j) is element
// e = ((b * H + h) * Tq + i) * Tk + j of a Philox draw based at `offset`
// (Note [Philox element mapping]: block offset + e / 2, lanes of e % 2), so a
// generator that reserve()s B * H * Tq * Tk elements owns exactly these
// counters. The element is kept when its uniform, philox::uniform_float's
// 24-bit k / 2^24 for every dtype (the draw of standalone dropout, Note
// [Dropout threshold] in kernels/dropout_backend.h), is >= p; kept
// probabilities are scaled by 1 / (1 - p). CPU and GPU evaluate this same
// function (k / 2^24 and p compared in double, exactly), so their masks are
// identical, and backward regenerates the mask from (seed, offset) instead
// of saving it. lse is always the statistic of the undropped softmax.
ACCRUE_HD bool attention_keep(uint64_t seed, uint64_t offset, int64_t element, double p) {
  uint32_t a, b;
  philox::element_bits(seed, offset, element, &a, &b);
  return static_cast<double>(philox::uniform_float(a)) >= p;
}

}  // namespace accrue::kernels

// ---- the backends ---------------------------------------------------------------------------

namespace accrue::kernels::cpu {
#include "accrue/kernels/attention_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/attention_functions.inc"
}  // namespace accrue::kernels::cuda

namespace accrue::kernels {

// cuDNN's fused flash attention (built only with the cuDNN frontend): a third
// path beside the backends' own, which kernels/attention.cpp chooses by the
// call rather than the device: bf16/f16 on CUDA, no dropout, and the layouts
// Note [Attention paths] admits. Same contract as the backend functions.
namespace cudnn {
// Whether the device can run cuDNN's fused attention (compute capability 8.0+).
bool device_supported(int device);
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const AttentionParams& p,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);
}  // namespace cudnn

}  // namespace accrue::kernels
