// Attention as research models use it: grouped-query heads, causal masks with
// their alignment stated, right-padded batches, packed documents, a sliding
// window, an additive bias or a boolean mask (the kernel contract and Note
// [Attention masks] are in kernels/attention.h and
// kernels/attention_backend.h). The plain GPT-2 forms (AttentionOptions,
// packed_causal_attention) are in autograd/transformer_ops.h.
//
// As PyTorch's F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p,
// is_causal, scale, enable_gqa=True):
//   scaled_dot_product_attention(q, k, v, SdpaOptions().causal().bias(m))
// except that accrue never broadcasts q, k, v themselves, and that a query
// row that sees no key gives 0 (PyTorch's fused kernels do; its math path
// gives NaN).
#pragma once

#include <cstdint>

#include "accrue/autograd/transformer_ops.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/attention.h"

namespace accrue {

using kernels::MaskAlignment;

// The options of scaled_dot_product_attention, as named setters; each is
// kernels::AttentionOptions' setter of that name (see there), except that
// the bias is differentiable and dropout draws from a Generator.
class SdpaOptions {
 public:
  SdpaOptions& causal(MaskAlignment a = MaskAlignment::top_left) {
    kernel_.causal(a);
    return *this;
  }
  SdpaOptions& alignment(MaskAlignment a) {
    kernel_.alignment(a);
    return *this;
  }
  SdpaOptions& window(int64_t left) {
    kernel_.window(left);
    return *this;
  }
  SdpaOptions& seq_lens(Tensor seq_len_q, Tensor seq_len_kv = Tensor()) {
    kernel_.seq_lens(std::move(seq_len_q), std::move(seq_len_kv));
    return *this;
  }
  SdpaOptions& varlen(Tensor cu_seqlens_q, Tensor cu_seqlens_kv = Tensor()) {
    kernel_.varlen(std::move(cu_seqlens_q), std::move(cu_seqlens_kv));
    return *this;
  }
  // Gets a gradient when it requires one (summed over its broadcast dims).
  SdpaOptions& bias(Tensor additive) {
    kernel_.bias(std::move(additive));
    return *this;
  }
  SdpaOptions& mask(Tensor keep) {
    kernel_.mask(std::move(keep));
    return *this;
  }
  SdpaOptions& scale(double s) {
    kernel_.scale(s);
    return *this;
  }
  // generator: dropout's stream; nullptr: default_generator().
  SdpaOptions& dropout(double p, Generator* generator = nullptr) {
    dropout_p_ = p;
    generator_ = generator;
    return *this;
  }
  // The kernel options, without dropout's stream.
  const kernels::AttentionOptions& kernel() const { return kernel_; }
  double dropout_p() const { return dropout_p_; }
  Generator* generator() const { return generator_; }

 private:
  kernels::AttentionOptions kernel_;
  double dropout_p_ = 0.0;
  Generator* generator_ = nullptr;
};

// q [B, Hq, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, dv] (Hq a multiple of
// Hkv) -> [B, Hq, Tq, dv], physically [B, Tq, Hq, dv]. Gradients flow to q, k,
// v and a bias that requires grad. Saves q, k, v, the output and the softmax
// statistics, never the attention matrix.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options);

}  // namespace accrue
