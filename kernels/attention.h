// Scaled dot-product attention, without autograd.
//
// q [B, Hq, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, dv] with Hq a multiple
// of Hkv (grouped-query attention; Hkv == 1 is multi-query): query head h
// reads kv head h / (Hq / Hkv), with nothing expanded in memory. Any strides
// whose last one is 1 (so the heads of a packed [B, T, 3, H, d] qkv buffer
// are views, never copies). out[b, h, i] = softmax(scale q k^T + bias, masked)
// v, and lse[b, h, i] = the row's log-sum-exp of the scaled, biased, masked
// scores: the statistics backward needs, never the T x T matrix. The masks
// (causal and its alignment, a sliding window, per-sequence lengths, packed
// documents, a boolean mask) are Note [Attention masks] in
// kernels/attention_backend.h; a query row that sees no key gives 0 output, 0
// gradient and lse = -inf.
//
// bf16/f16 on CUDA run cuDNN's fused flash attention (graphs built once per
// shape, dtype and options and cached; the workspace from accrue's
// allocator) when accrue was built with the cuDNN frontend and cuDNN accepts
// the call; otherwise, and for f32 (CUDA) and f32/f64 (CPU), a composed path
// of plain kernels (Note [Attention paths] in kernels/attention.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accrue/core/tensor.h"

namespace accrue::kernels {

// Where the diagonal of the causal mask and of the sliding window sits when
// Tq != Tk (per sequence, with lengths or documents):
//  - top_left: query i sees keys j <= i (PyTorch's is_causal, torch.tril);
//  - bottom_right: query i sees keys j <= i + Tk - Tq (the last query sees
//    every key: decoding against a KV cache; flash-attn's convention).
// They agree when Tq == Tk.
enum class MaskAlignment { top_left, bottom_right };
const char* alignment_name(MaskAlignment a);

// The options of one attention call, as named setters:
//   AttentionOptions().causal().window(4096).seq_lens(lq, lkv)
class AttentionOptions {
 public:
  // Causal masking with its diagonal aligned as `a` (which the window uses too).
  AttentionOptions& causal(MaskAlignment a = MaskAlignment::top_left) {
    causal_ = true;
    alignment_ = a;
    return *this;
  }
  AttentionOptions& causal(bool on) {
    causal_ = on;
    return *this;
  }
  // The diagonal's alignment without causal masking (for a window alone).
  AttentionOptions& alignment(MaskAlignment a) {
    alignment_ = a;
    return *this;
  }
  // A sliding window: query i sees only the `left` keys ending at its
  // diagonal, keys j with diag(i) - left < j (cuDNN's sliding_window_length,
  // Hugging Face's sliding_window; flash-attn's window_size[0] is left - 1).
  // Without causal the keys right of the diagonal stay visible. 0: none.
  AttentionOptions& window(int64_t left) {
    window_ = left;
    return *this;
  }
  // Right-padded batches: sequence b has seq_len_q[b] queries and
  // seq_len_kv[b] keys (i64 [B], on the CPU or q's device); query rows past
  // the length give 0 output and get 0 gradient, keys past it are masked.
  // seq_len_kv undefined: the same as seq_len_q (self-attention).
  AttentionOptions& seq_lens(Tensor seq_len_q, Tensor seq_len_kv = Tensor()) {
    seq_len_q_ = std::move(seq_len_q);
    seq_len_kv_ = std::move(seq_len_kv);
    return *this;
  }
  // Packed documents (varlen): B == 1 and document n holds queries
  // [cu_seqlens_q[n], cu_seqlens_q[n + 1]) and keys [cu_seqlens_kv[n],
  // cu_seqlens_kv[n + 1]) (i64 [N + 1], 0 first, Tq / Tk last, nondecreasing;
  // on the CPU or q's device). Attention never crosses a document; causal and
  // window apply within each. cu_seqlens_kv undefined: the same as the queries'.
  AttentionOptions& varlen(Tensor cu_seqlens_q, Tensor cu_seqlens_kv = Tensor()) {
    cu_seqlens_q_ = std::move(cu_seqlens_q);
    cu_seqlens_kv_ = std::move(cu_seqlens_kv);
    return *this;
  }
  // An additive bias on the scaled scores, [B or 1, Hq or 1, Tq, Tk] of q's
  // dtype (-inf masks an entry), or a boolean mask of that shape, true where
  // the query may attend (PyTorch's attn_mask). One of the two.
  AttentionOptions& bias(Tensor additive) {
    bias_ = std::move(additive);
    return *this;
  }
  AttentionOptions& mask(Tensor keep) {
    mask_ = std::move(keep);
    return *this;
  }
  // Default 1 / sqrt(d).
  AttentionOptions& scale(double s) {
    scale_ = s;
    return *this;
  }
  // Dropout on the probabilities, its Philox stream (Note [Philox element
  // mapping]): element (b, h, i, j) uses counter offset + ((b * Hq + h) * Tq +
  // i) * Tk + j.
  AttentionOptions& dropout(double p, uint64_t seed = 0, uint64_t offset = 0) {
    dropout_p_ = p;
    seed_ = seed;
    offset_ = offset;
    return *this;
  }

  bool is_causal() const { return causal_; }
  MaskAlignment get_alignment() const { return alignment_; }
  int64_t get_window() const { return window_; }
  const Tensor& seq_len_q() const { return seq_len_q_; }
  const Tensor& seq_len_kv() const { return seq_len_kv_; }
  const Tensor& cu_seqlens_q() const { return cu_seqlens_q_; }
  const Tensor& cu_seqlens_kv() const { return cu_seqlens_kv_; }
  const Tensor& get_bias() const { return bias_; }
  const Tensor& get_mask() const { return mask_; }
  const std::optional<double>& get_scale() const { return scale_; }
  double dropout_p() const { return dropout_p_; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }

 private:
  bool causal_ = false;
  MaskAlignment alignment_ = MaskAlignment::top_left;
  int64_t window_ = 0;
  Tensor seq_len_q_, seq_len_kv_, cu_seqlens_q_, cu_seqlens_kv_, bias_, mask_;
  std::optional<double> scale_;
  double dropout_p_ = 0.0;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// Writes out (shape [B, Hq, Tq, dv], any strides whose last is 1) and lse
// (f32 [B, Hq, Tq] contiguous; f64 for f64 inputs).
void attention_into(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& options, const Tensor& out, const Tensor& lse);
// Allocates out physically as [B, Tq, Hq, dv] (returned as the [B, Hq, Tq, dv]
// view, so that out.transpose(1, 2) is contiguous) and lse.
struct AttentionResult {
  Tensor out;
  Tensor lse;
};
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionOptions& options);

// dq, dk, dv (shaped like q, k, v, any strides whose last is 1, e.g. views of
// one packed [B, T, 3, H, d] buffer) are written (never added to). dbias,
// when defined, receives the gradient of the additive bias (shaped like it,
// contiguous; summed over its broadcast dims).
void attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionOptions& options, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dbias = Tensor());

// Whether bf16/f16 attention on CUDA goes through cuDNN in this build (and
// this process: not under ACCRUE_ATTENTION_COMPOSED=1 or
// set_cudnn_attention(false), Note [Attention paths]).
bool cudnn_attention_available();
// Sends every later call to the composed path (false) or lets cuDNN take what
// it can again (true, the default), process-wide: to compare the two paths.
void set_cudnn_attention(bool enabled);

// The path the last attention call on this thread took (forward or
// backward), and why cuDNN did not take it when it could have been a cuDNN
// call (empty otherwise): what tests assert, and what a user reads when a
// bf16 model runs slower than expected.
enum class AttentionPath { none, cpu, composed, cudnn };
const char* attention_path_name(AttentionPath p);
AttentionPath last_attention_path();
const std::string& last_attention_refusal();

}  // namespace accrue::kernels
