// Fusions for transformer blocks, without autograd: the bias (+ GELU) in the
// GEMM's epilogue, the residual add fused with the LayerNorm or RMSNorm that
// follows it, RMSNorm, rotary position embeddings and SwiGLU.
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"

// The rotary embedding's options live in namespace accrue: the
// differentiable accrue::rope (autograd/transformer_ops.h) takes the same ones.
namespace accrue {

// Note [Rotary embedding]
// ~~~~~~~~~~~~~~~~~~~~~~~
// x is [B, T, H, D] (batch, token, head, head dim: the layout of q, k, v
// split from a packed [B, T, 3 * H * D] qkv, so a strided view of the packed
// tensor is read in place, no copy; a [B, H, T, D] tensor is passed as its
// transpose(1, 2) view); positions is i64 [B, T] or [T] (shared
// by the batch), each in [0, 2^24) (the largest range f32 holds exactly),
// so packed documents restart at 0 by their own position ids. Pair i of
// D / 2 is rotated by angle = position * inv_freq[i]:
//  - RotateHalf (Hugging Face Llama, GPT-NeoX): the pair (x[i], x[i + D/2]);
//  - Interleaved (Meta's original Llama, GPT-J): the pair (x[2i], x[2i + 1]);
// out_a = a cos - b sin, out_b = b cos + a sin. The frequencies are Hugging
// Face's LlamaRotaryEmbedding: inv_freq[i] = 1 / theta^(2i / D) with the
// exponent formed in f32, then (RopeScaling::llama3) rope_type "llama3"'s
// scaling, then angle, cos and sin in f32, as transformers computes them;
// f64 inputs compute all of it in f64 instead (exact where transformers'
// table is not: its forward casts inv_freq and positions to f32 even in an
// f64 model, so an f64 golden test against it computes that table in f64
// too). The rotation of
// each pair is then computed in f32 (f64) and rounded once, where transformers
// rounds cos and sin to x's dtype first: 16-bit results may differ by one ulp.
// The backward is the rotation by -angle (inverse = true).
enum class RopeStyle { RotateHalf, Interleaved };

// Llama 3's frequency scaling (transformers' rope_type "llama3"): wavelengths
// above original_max_position / low_freq_factor are divided by factor, those
// below original_max_position / high_freq_factor are kept, and those between
// are interpolated. type none (the default) keeps the plain frequencies.
struct RopeScaling {
  enum class Type { none, llama3 };
  Type type = Type::none;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;

  static RopeScaling llama3(double factor = 8.0, double low_freq_factor = 1.0,
                            double high_freq_factor = 4.0, int64_t original_max_position = 8192) {
    return RopeScaling{Type::llama3, factor, low_freq_factor, high_freq_factor,
                       original_max_position};
  }
};

}  // namespace accrue

namespace accrue::kernels {

struct NormPartials;  // kernels/ops.h

// y = x @ weight^T + bias for x [N, in], weight [out, in], bias [out], one
// dtype. On the CPU it is kernels::matmul then kernels::binary(Add), bit for
// bit. On CUDA bf16/f16/f32 it is one cuBLASLt GEMM with the BIAS epilogue,
// which rounds once instead of twice (Note [Bias epilogue] in
// kernels/cuda/gemm_epilogue.cu); elsewhere matmul then add.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// y = gelu(x @ weight^T + bias) for x [N, in], weight [out, in], bias [out]
// (GELU's tanh approximation). On CUDA bf16/f16/f32 it is one cuBLASLt GEMM
// with the GELU_AUX_BIAS epilogue; pre_activation (x @ weight^T + bias, [N,
// out], x's dtype) is what backward needs and is returned through the pointer.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   Tensor* pre_activation);
// grad * gelu'(pre_activation), same shape and dtype.
Tensor gelu_backward(const Tensor& grad, const Tensor& pre_activation);
// (grad @ weight) * gelu'(pre_activation): the gradient that reaches the
// pre-activation of linear(gelu(pre_activation), weight, bias), for grad [N,
// out], weight [out, hidden], pre_activation [N, hidden], one dtype; [N,
// hidden]. On the CPU it is kernels::matmul then gelu_backward, bit for bit.
// On CUDA bf16/f16/f32 with at least 32,768 rows it is one cuBLASLt GEMM with
// the DGELU epilogue, which multiplies the fp32 product by GELU's derivative
// before rounding once (Note [GELU gradient epilogue] in
// kernels/cuda/gemm_epilogue.cu); elsewhere matmul then gelu_backward.
Tensor matmul_gelu_backward(const Tensor& grad, const Tensor& weight, const Tensor& pre_activation);

struct ResidualLayerNormOutput {
  Tensor sum;   // x + residual
  Tensor out;   // layer_norm(sum) over the last dim
  Tensor mean;  // f32 (f64 for f64), one per row
  Tensor rstd;
};
// One pass: sum = x + residual (same shape, contiguous result), out = LayerNorm(sum).
ResidualLayerNormOutput residual_layer_norm(const Tensor& x, const Tensor& residual,
                                            const Tensor& weight, const Tensor& bias, double eps);

struct RmsNormOutput {
  Tensor out;   // x * rstd * weight, x's shape and dtype, contiguous
  Tensor rstd;  // 1 / sqrt(mean(x^2) + eps), f32 (f64 for f64), one per row
};
// RMSNorm over the last dim (Llama's LlamaRMSNorm, PyTorch's F.rms_norm):
// out = x / sqrt(mean(x^2) + eps) * weight, 16-bit inputs computed in f32 and
// rounded once. weight [D] (x's dtype, or f32 master weights beside 16-bit x)
// may be undefined; eps > 0. Any layout with stride 1 in the last dim whose
// leading dims merge into two strided levels is read in place (per-head q or
// k of a packed [B, T, 3, H, D] qkv, normalized over D: qk_norm); any other
// through a contiguous copy. out is contiguous.
RmsNormOutput rms_norm(const Tensor& x, const Tensor& weight, double eps);
// Returns dx. dweight [D] (f32 or x's dtype; undefined when not wanted) is
// written, or added to when accumulate, with fixed-order sums
// (Note [Deterministic column sums]).
Tensor rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const Tensor& rstd, const Tensor& dweight, bool accumulate);
// Its first half (NormPartials in kernels/ops.h): dx and, when want_dweight,
// dweight's partial sums, which norm_param_totals(partials, dweight, {}, ...)
// then writes or adds. dx_add, where defined (x's shape, dtype and device), is
// added to dx before its one rounding (Note [Fan-out sums in the backward] in
// autograd/engine.cpp).
Tensor rms_norm_backward_partials(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, bool want_dweight, NormPartials* partials,
                                  const Tensor& dx_add = Tensor());

struct ResidualRmsNormOutput {
  Tensor sum;   // x + residual, rounded to x's dtype
  Tensor out;   // rms_norm(sum) over the last dim
  Tensor rstd;  // f32 (f64 for f64), one per row
};
// One pass: sum = x + residual (same shape, contiguous result), out = rms_norm(sum).
ResidualRmsNormOutput add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                   double eps);

// Positions at or above this are refused (Note [Rotary embedding]).
constexpr int64_t kRopeMaxPosition = int64_t{1} << 24;

// Note [Rotary embedding]: x [B, T, H, D] (any strides, unit stride in D, D
// even), positions i64 [B, T] or [T]; returns a contiguous [B, T, H, D] of
// x's dtype, rotated by +angle (or -angle when inverse: the backward). The
// positions' range check (Note [Deferred index checks]: on CUDA a host
// synchronization outside a Window, two small launches inside one) is skipped
// with check_positions false, which the backward passes: its forward checked
// the same positions, and any position rotates within bounds.
Tensor rope(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
            const RopeScaling& scaling = {}, bool inverse = false, bool check_positions = true);
// The same rotation written back into x (a strided view of a packed qkv is
// rotated where it lies), for inference and KV caches: no autograd records
// it. x must not overlap itself (no 0 strides).
void rope_(const Tensor& x, const Tensor& positions, double theta, RopeStyle style,
           const RopeScaling& scaling = {}, bool inverse = false);

// SwiGLU: out = silu(gate) * up = gate * sigmoid(gate) * up, computed in f32
// (f64) and rounded once; gate and up of one shape and dtype, any layout.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// The same over the halves of x [..., 2F]: gate = x[..., :F], up = x[..., F:]
// (one GEMM producing both), read in place; returns [..., F].
Tensor swiglu_packed(const Tensor& x);
struct SwigluGrads {
  Tensor dgate;
  Tensor dup;
};
// d/dgate and d/dup of sum(grad * swiglu(gate, up)), one kernel.
SwigluGrads swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up);
// The same for swiglu_packed: [..., 2F], dgate in the first half, dup in the second.
Tensor swiglu_packed_backward(const Tensor& grad, const Tensor& x);

}  // namespace accrue::kernels
