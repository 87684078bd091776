// The differentiable ops transformers are built from (beyond autograd/ops.h).
// Each has a CPU reference, passes the float64 gradcheck, and is checked on
// the GPU against the CPU (tests/kernels, tests/autograd).
#pragma once

#include <cstdint>
#include <optional>

#include "accrue/autograd/ops.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/fused.h"

namespace accrue {

struct AttentionOptions {
  bool causal = false;
  double dropout_p = 0.0;
  std::optional<double> scale;     // default 1 / sqrt(head dim)
  Generator* generator = nullptr;  // dropout's stream; nullptr: default_generator()
};
// q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv] -> [B, H, Tq, dv]; any
// strides with the last one 1. The result is physically [B, Tq, H, dv], so
// transpose(result, 1, 2) is contiguous. Saves q, k, v, the output and the
// softmax statistics, never the attention matrix.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});
// GPT-2's packed form: qkv [B, T, 3 * H * d] (q, k, v concatenated in that
// order, heads contiguous within each) -> [B, T, H * d], causal. Backward
// writes one dqkv buffer (no slicing or concatenation copies).
Tensor packed_causal_attention(const Tensor& qkv, int64_t n_head,
                               const AttentionOptions& options = {});

// Note [Dropout mask from the counter] (kernels/dropout.h). p in [0, 1);
// with training false or p == 0 it returns x itself.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* generator = nullptr);

// gelu(x @ weight^T + bias): x [..., in], weight [out, in], bias [out]. The
// weight and bias gradients go straight into their arena slots (Note [Fused
// weight-gradient accumulation]).
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// A transformer's MLP without its dropout: linear(linear_gelu(x, fc_weight,
// fc_bias), proj_weight, proj_bias) for x [..., in], fc_weight [hidden, in],
// fc_bias [hidden], proj_weight [out, hidden], proj_bias [out], as one node,
// so that its backward computes the GELU's gradient in the epilogue of the
// GEMM before it (kernels::matmul_gelu_backward, Note [GELU gradient
// epilogue]). The forward gives the bits of the two ops; the four parameter
// gradients go straight into their arena slots, in the two ops' order.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias);

// Pre-LayerNorm transformers' residual stream: sum = x + residual and
// normed = layer_norm(sum, weight, bias, eps), computed in one pass and
// recorded as two nodes (an add and a LayerNorm), so each result has its own
// gradient path.
struct ResidualNorm {
  Tensor sum;
  Tensor normed;
};
ResidualNorm residual_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                 const Tensor& bias, double eps = 1e-5);

// RMSNorm over the last dim (Llama's LlamaRMSNorm): x / sqrt(mean(x^2) + eps)
// * weight, 16-bit inputs computed in f32; weight [D] may be undefined, eps >
// 0. Saves x and the per-row rstd only; the weight's gradient goes straight
// into its arena slot (Note [Fused weight-gradient accumulation]).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// Per-head RMSNorm of q or k (Qwen3, OLMo 2, Gemma 3): x [..., H, D]
// normalized over D with weight [D]; rms_norm of that last dim. x may be a
// strided view (q of a packed qkv).
inline Tensor qk_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6) {
  return rms_norm(x, weight, eps);
}

// The residual stream of pre-RMSNorm transformers: sum = x + residual and
// normed = rms_norm(sum, weight, eps) in one pass, recorded as two nodes (an
// add and an RMSNorm of the recorded sum), as residual_layer_norm.
ResidualNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          double eps = 1e-6);

// Rotary position embeddings (Note [Rotary embedding], kernels/fused.h): x
// [B, T, H, D] (a strided view of a packed qkv is read in place), positions
// i64 [B, T] or [T] (packed documents restart at 0), D even. Returns a
// contiguous [B, T, H, D]; backward rotates the gradient by -angle.
Tensor rope(const Tensor& x, const Tensor& positions, double theta = 10000.0,
            RopeStyle style = RopeStyle::RotateHalf, const RopeScaling& scaling = {});

// SwiGLU: silu(gate) * up in one kernel, its backward in one kernel; gate
// and up of one shape. Saves gate and up.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// SwiGLU of x [..., 2F] = [gate | up] (the output of one fused gate-and-up
// projection), read in place; returns [..., F]; backward writes one [..., 2F]
// gradient.
Tensor swiglu_packed(const Tensor& x);

// Note [Fused classifier] (kernels/classifier.h): the loss of logits =
// hidden @ weight^T over the first valid_classes columns, as (sum, count),
// without materializing fp32 logits. hidden [..., D], weight [V_padded, D],
// targets [...] matching hidden's leading dims.
Loss classifier_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                              int64_t valid_classes, int64_t ignore_index = -100);

}  // namespace accrue
