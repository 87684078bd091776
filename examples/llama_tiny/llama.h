// A Llama-style decoder written from accrue's public ops only: the fused
// rms_norm, rope (rotate-half, as Hugging Face's Llama) and swiglu of
// autograd/transformer_ops.h, grouped-query attention with causal masking
// and per-sequence lengths (autograd/attention_ops.h), and an untied head. Parameters carry Hugging
// Face's LlamaForCausalLM names (model.embed_tokens.weight,
// model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight), so its state dict loads from
// transformers' weights (tests/golden/llama_golden_test.cpp trains both side by side).
//
// Batches are right-padded: `lengths` [B] gives each sequence's tokens; the
// padded keys are out of every query's attention, and the padded
// targets are -100, which cross_entropy ignores, so a window's loss is the
// mean over its real tokens (the Window's item-count normalization).
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/autograd/attention_ops.h"

namespace accrue::examples {

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t hidden = 64;
  int64_t intermediate = 176;
  int64_t layers = 2;
  int64_t heads = 4;     // query heads
  int64_t kv_heads = 2;  // key/value heads: heads / kv_heads query heads share one
  int64_t max_positions = 256;
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  int64_t head_dim() const { return hidden / heads; }
};

// Hugging Face's LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight, over the last dim.
class RMSNorm : public nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, const nn::ParamOptions& o) : eps_(eps) {
    weight_ = register_parameter("weight", full({dim}, 1.0, o.dtype, o.device));
  }
  Tensor forward(const Tensor& x) const { return rms_norm(x, weight_, eps_); }

 private:
  double eps_;
  Tensor weight_;
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(const LlamaConfig& c, const nn::ParamOptions& o) : c_(c) {
    const int64_t D = c.head_dim();
    q_ = &register_module("q_proj", std::make_unique<nn::Linear>(c.hidden, c.heads * D, false, o));
    k_ = &register_module("k_proj",
                          std::make_unique<nn::Linear>(c.hidden, c.kv_heads * D, false, o));
    v_ = &register_module("v_proj",
                          std::make_unique<nn::Linear>(c.hidden, c.kv_heads * D, false, o));
    o_ = &register_module("o_proj", std::make_unique<nn::Linear>(c.heads * D, c.hidden, false, o));
  }

  // x [B, T, C]; positions i64 [T]; lengths i64 [B], each sequence's tokens.
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& lengths) const {
    const int64_t B = x.size(0), T = x.size(1), D = c_.head_dim();
    auto heads = [&](const nn::Linear& proj, int64_t n, bool rotate) {  // [B, n, T, D] views
      Tensor h = reshape(proj.forward(x), {B, T, n, D});
      if (rotate) h = rope(h, positions, c_.rope_theta);
      return transpose(h, 1, 2);
    };
    // Grouped-query attention: kv head j serves query heads j*G .. j*G + G-1,
    // with nothing expanded; a query sees the keys at or before it inside its
    // sequence (keys past lengths[b] are padding).
    const Tensor out = scaled_dot_product_attention(
        heads(*q_, c_.heads, true), heads(*k_, c_.kv_heads, true), heads(*v_, c_.kv_heads, false),
        SdpaOptions().causal().seq_lens(lengths,
                                        lengths));  // [B, H, T, D], physically [B, T, H, D]
    return o_->forward(reshape(transpose(out, 1, 2), {B, T, c_.heads * D}));
  }

 private:
  LlamaConfig c_;
  nn::Linear *q_, *k_, *v_, *o_;
};

// SwiGLU: down(silu(gate(x)) * up(x)).
class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(const LlamaConfig& c, const nn::ParamOptions& o) {
    gate_ = &register_module("gate_proj",
                             std::make_unique<nn::Linear>(c.hidden, c.intermediate, false, o));
    up_ = &register_module("up_proj",
                           std::make_unique<nn::Linear>(c.hidden, c.intermediate, false, o));
    down_ = &register_module("down_proj",
                             std::make_unique<nn::Linear>(c.intermediate, c.hidden, false, o));
  }
  Tensor forward(const Tensor& x) const {
    return down_->forward(swiglu(gate_->forward(x), up_->forward(x)));
  }

 private:
  nn::Linear *gate_, *up_, *down_;
};

class LlamaLayer : public nn::Module {
 public:
  LlamaLayer(const LlamaConfig& c, const nn::ParamOptions& o) {
    norm1_ = &register_module("input_layernorm", std::make_unique<RMSNorm>(c.hidden, c.rms_eps, o));
    attn_ = &register_module("self_attn", std::make_unique<LlamaAttention>(c, o));
    norm2_ = &register_module("post_attention_layernorm",
                              std::make_unique<RMSNorm>(c.hidden, c.rms_eps, o));
    mlp_ = &register_module("mlp", std::make_unique<LlamaMLP>(c, o));
  }
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& lengths) const {
    const Tensor h = x + attn_->forward(norm1_->forward(x), positions, lengths);
    return h + mlp_->forward(norm2_->forward(h));
  }

 private:
  RMSNorm *norm1_, *norm2_;
  LlamaAttention* attn_;
  LlamaMLP* mlp_;
};

class LlamaModel : public nn::Module {
 public:
  LlamaModel(const LlamaConfig& c, const nn::ParamOptions& o) {
    embed_ = &register_module("embed_tokens",
                              std::make_unique<nn::Embedding>(c.vocab_size, c.hidden, o));
    for (int64_t i = 0; i < c.layers; ++i)
      layers_.push_back(
          &register_module("layers." + std::to_string(i), std::make_unique<LlamaLayer>(c, o)));
    norm_ = &register_module("norm", std::make_unique<RMSNorm>(c.hidden, c.rms_eps, o));
  }
  Tensor forward(const Tensor& idx, const Tensor& positions, const Tensor& lengths) const {
    Tensor x = embed_->forward(idx);
    for (const LlamaLayer* layer : layers_)
      x = layer->forward(x, positions, lengths);
    return norm_->forward(x);
  }

 private:
  nn::Embedding* embed_;
  std::vector<LlamaLayer*> layers_;
  RMSNorm* norm_;
};

class Llama : public nn::Module {
 public:
  Llama(const LlamaConfig& c, const nn::ParamOptions& o) : c_(c) {
    model_ = &register_module("model", std::make_unique<LlamaModel>(c, o));
    head_ =
        &register_module("lm_head", std::make_unique<nn::Linear>(c.hidden, c.vocab_size, false, o));
    // The positions 0 .. max_positions - 1 of the rotary embedding, a buffer
    // so that Module::to moves it with the weights (an i64 buffer keeps its
    // dtype). Not in the state dict: it follows from the config.
    std::vector<int64_t> p(static_cast<size_t>(c.max_positions));
    for (int64_t i = 0; i < c.max_positions; ++i)
      p[static_cast<size_t>(i)] = i;
    positions_ = register_buffer("positions",
                                 from_vector<int64_t>(p, {c.max_positions}, DType::i64, o.device),
                                 nn::BufferOptions().persistent(false));
  }

  const LlamaConfig& config() const { return c_; }

  // (sum, count) cross-entropy of the right-padded batch idx [B, T] whose
  // sequence b has lengths[b] tokens; targets [B, T] hold -100 past them.
  Loss loss(const Tensor& idx, const Tensor& targets, const std::vector<int64_t>& lengths) const {
    const int64_t B = idx.size(0), T = idx.size(1);
    ACCRUE_CHECK(static_cast<int64_t>(lengths.size()) == B && T <= c_.max_positions,
                 "Llama::loss: ", lengths.size(), " lengths for ", B, " sequences of ", T,
                 " tokens (at most ", c_.max_positions, ")");
    const Tensor lens = from_vector<int64_t>(lengths, {B}, DType::i64, idx.device());
    const Tensor h = model_->forward(idx, narrow(positions_, 0, 0, T), lens);
    const Tensor logits = head_->forward(h);  // [B, T, V]
    return cross_entropy(reshape(logits, {B * T, c_.vocab_size}), reshape(targets, {B * T}));
  }

 private:
  LlamaConfig c_;
  LlamaModel* model_;
  nn::Linear* head_;
  Tensor positions_;
};

}  // namespace accrue::examples
