// GPT-2 written from accrue's public differentiable primitives only, on an
// nn::GPT2's parameters: attention as matmul + mask + softmax + matmul, the
// heads split and merged by reshape / permute / contiguous, q, k, v narrowed
// out of one projection, LayerNorm, Linear and GELU each on their own, the
// logits materialized. No fused op (no cuDNN attention, no fused residual
// LayerNorm, no fused classifier).
//
// It is the yardstick of the eager kernels: a research user composing their
// own layers pays every strided copy and broadcast this model makes. On the
// same weights it computes the fused model's loss (tests/nn/composed_gpt2_test.cpp:
// the loss and every parameter gradient in f64 on the CPU).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "accrue.h"

namespace accrue::examples {

// (sum, count) cross-entropy of idx -> targets, both [B, T]. The positions and
// the causal mask are built once per (T, device, dtype) and kept, as a
// module's buffers would be: a model built anew every call would time the
// host-to-device copies, not the kernels.
class ComposedGPT2 {
 public:
  explicit ComposedGPT2(const nn::GPT2& model) : model_(model) {}

  Loss loss(const Tensor& idx, const Tensor& targets) {
    const nn::GPT2Config& c = model_.config();
    const int64_t B = idx.size(0), T = idx.size(1), C = c.n_embd, H = c.n_head, D = C / H;
    if (!positions_.defined() || positions_.size(0) != T || positions_.device() != idx.device() ||
        mask_.dtype() != model_.wte().dtype())
      build_constants(T, idx.device());

    Tensor x = embedding(model_.wte(), idx) + embedding(model_.wpe(), positions_);  // [B, T, C]
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const nn::Block& block = model_.block(l);
      const nn::LayerNorm& ln1 = block.ln_1();
      const Tensor h = layer_norm(x, ln1.weight(), ln1.bias(), ln1.eps());
      const nn::Linear& c_attn = block.attn().c_attn();
      const Tensor qkv = linear(h, c_attn.weight(), c_attn.bias());  // [B, T, 3C]
      auto heads = [&](int64_t which) {                              // [B, H, T, D]
        return contiguous(
            permute(reshape(narrow(qkv, 2, which * C, C), {B, T, H, D}), {0, 2, 1, 3}));
      };
      const Tensor q = heads(0), k = heads(1), v = heads(2);
      const Tensor scores =
          matmul(q, transpose(k, 2, 3)) * (1.0 / std::sqrt(static_cast<double>(D)));
      const Tensor attention = softmax(scores + mask_, 3);
      const Tensor merged =
          reshape(contiguous(permute(matmul(attention, v), {0, 2, 1, 3})), {B, T, C});
      const nn::Linear& attn_proj = block.attn().c_proj();
      x = x + linear(merged, attn_proj.weight(), attn_proj.bias());
      const nn::LayerNorm& ln2 = block.ln_2();
      const nn::Linear& fc = block.mlp().c_fc();
      const nn::Linear& proj = block.mlp().c_proj();
      const Tensor m =
          gelu(linear(layer_norm(x, ln2.weight(), ln2.bias(), ln2.eps()), fc.weight(), fc.bias()));
      x = x + linear(m, proj.weight(), proj.bias());
    }
    const nn::LayerNorm& ln_f = model_.ln_f();
    const Tensor out = layer_norm(x, ln_f.weight(), ln_f.bias(), ln_f.eps());
    const Tensor vocabulary = narrow(model_.wte(), 0, 0, c.vocab_size);
    const Tensor logits = matmul(out, transpose(vocabulary, 0, 1));  // [B, T, V]
    return cross_entropy(reshape(logits, {B * T, c.vocab_size}), reshape(targets, {B * T}));
  }

 private:
  void build_constants(int64_t T, Device device) {
    std::vector<int64_t> p(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t)
      p[static_cast<size_t>(t)] = t;
    positions_ = from_vector<int64_t>(p, {T}, DType::i64, device);
    // The causal mask, added to the scores: 0 on and below the diagonal, -inf above.
    std::vector<double> mask(static_cast<size_t>(T * T), 0.0);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j)
        mask[static_cast<size_t>(i * T + j)] = -std::numeric_limits<double>::infinity();
    mask_ = from_vector<double>(mask, {T, T}, model_.wte().dtype(), device);
  }

  const nn::GPT2& model_;
  Tensor positions_, mask_;
};

}  // namespace accrue::examples
