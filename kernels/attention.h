// Scaled dot-product attention, without autograd.
//
// q [B, H, Tq, d], k and v [B, H, Tk, d] (v's last dim may differ: dv), any
// strides whose last one is 1 (so the heads of a packed [B, T, 3, H, d] qkv
// buffer are views, never copies). out[b, h, i] = softmax(scale * q k^T
// (+ causal mask)) v, and lse[b, h, i] = the row's log-sum-exp of the scaled
// (masked) scores: the statistics backward needs, never the T x T matrix.
//
// bf16/f16 on CUDA run cuDNN's fused flash attention (graphs built once per
// shape, dtype and options and cached; the workspace from accrue's
// allocator) when accrue was built with the cuDNN frontend and dropout_p is 0;
// otherwise, and for f32 (CUDA) and f32/f64 (CPU), a composed path of plain
// kernels (Note [Attention paths] in kernels/attention.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

struct AttentionOptions {
  bool causal = false;  // position i attends to keys j <= i + (Tk - Tq)
  double dropout_p = 0.0;
  std::optional<double> scale;  // default 1 / sqrt(d)
  // Dropout's Philox stream (Note [Philox element mapping]): element (b, h, i, j)
  // of the probabilities uses counter offset + ((b * H + h) * Tq + i) * Tk + j.
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Writes out (shape [B, H, Tq, dv], any strides whose last is 1) and lse
// (f32 [B, H, Tq] contiguous; f64 for f64 inputs).
void attention_into(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& options, const Tensor& out, const Tensor& lse);
// Allocates out physically as [B, Tq, H, dv] (returned as the [B, H, Tq, dv]
// view, so that out.transpose(1, 2) is contiguous) and lse.
struct AttentionResult {
  Tensor out;
  Tensor lse;
};
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& options);

// dq, dk, dv (shaped like q, k, v, any strides whose last is 1, e.g. views of
// one packed [B, T, 3, H, d] buffer) are written (never added to).
void attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionOptions& options, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv);

// Whether bf16/f16 attention on CUDA goes through cuDNN in this build (and
// this process: not under ACCRUE_ATTENTION_COMPOSED=1, Note [Attention paths]).
bool cudnn_attention_available();

}  // namespace accrue::kernels
