// A Llama-style decoder (Llama 2, 3, 3.1, 3.2 and Qwen3) built from an
// nn::LlamaConfig: token embedding, pre-RMSNorm blocks of grouped-query
// attention with rotary embeddings (and Qwen3's per-head QK-norm) and a SwiGLU
// MLP, a final RMSNorm and an output layer, untied or tied to the embedding.
//
//   nn::Llama model(nn::LlamaConfig::from_name("llama-125m"), {Device::cuda(0), DType::bf16,
//   &gen}); Loss loss = model.loss(idx, targets, nn::BatchLayout::padded(lengths)); auto hf =
//   nn::Llama::from_hf("Llama-3.2-1B", {Device::cuda(0), DType::bf16});
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/nn/hf_checkpoint.h"
#include "accrue/nn/llama_config.h"
#include "accrue/nn/module.h"

namespace accrue::nn {

// Note [Llama batch layouts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A micro-batch idx [B, T] is one of:
//  - full: every row is one sequence of T tokens (positions 0 .. T-1);
//  - padded: row b is one sequence of seq_lens[b] tokens, right-padded to T
//    (positions 0 .. T-1; keys past seq_lens[b] are masked and those rows'
//    outputs are zero, their targets must be -100);
//  - packed: the B * T tokens, read row after row, are documents, document n
//    the tokens [cu_seqlens[n], cu_seqlens[n + 1]) (0 first, B * T last);
//    attention never crosses a document, and positions [B, T] (restarting at
//    0 with each document) feed the rotary embedding. Without positions the
//    forward derives them from cu_seqlens where those live, with a few small
//    kernels and no read-back (Note [Positions from document offsets]).
// The tensors are i64 and live on the model's device (or the CPU), so the
// forward never reads them back: their values are checked where they are on
// the CPU, and by the attention and rope kernels' deferred checks otherwise.
// The host helpers (padded from a vector, packed_documents) build them with
// one upload each.
// Note [Positions from document offsets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Token t (of the B * T read row after row) lies in document d(t) = #{k >= 1 :
// cu_seqlens[k] <= t}, and its position is t - cu_seqlens[d(t)]. d is a
// cumulative sum of marks: index_add ones at cu_seqlens[1 .. N] into n + 1
// zeros (an empty document adds a second one at the same place, skipping
// its number), cumsum of the first n. Then index_select of the starts and
// t - start (an index_add with alpha -1): a few kernels on the offsets' device, none reading values
// back (inside a Window the index checks are deferred, Note [Deferred index checks]).
Tensor positions_from_cu_seqlens(const Tensor& cu_seqlens, int64_t B, int64_t T);

// Note [Documents within rows]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Packed documents whose every row starts a document (data::DocumentBatches'
// batches are such: cu_seqlens holds each b * T) need only their positions:
// BatchLayout::documents_within_rows(positions). Attention then runs per row,
// B sequences of T tokens, causal, with an additive bias [B, 1, T, T] of 0
// between tokens of one document and -inf across documents, built once per
// forward from the positions (a token's document starts at t - position in
// its row): a few elementwise kernels on the device, nothing read back, and
// inputs of fixed shape, so it is captured and replayed under CUDA graphs
// like the rest. The packed varlen path needs the offsets on the host for
// cuDNN (Note [Attention paths] in kernels/attention.cpp) and otherwise
// computes the whole B * T sequence's scores in its composed path; the bias
// keeps cuDNN's fused kernels, at 2 T^2 bytes of bias a row, read per head.
// Every query sees itself, so no row is empty. The result is the packed
// path's up to the summation order (tests/nn/llama_test.cpp). A layout whose
// documents cross rows must stay packed: positions on the CPU are checked
// (each row starts at 0, then counts up by one or restarts at 0).
struct BatchLayout {
  Tensor seq_lens;           // i64 [B] (padded)
  Tensor cu_seqlens;         // i64 [N + 1] (packed)
  Tensor positions;          // i64 [B, T] (packed, optional; within rows, required)
  bool within_rows = false;  // Note [Documents within rows]
  // Llama::forward's own: the within-rows bias it built for its layers.
  Tensor document_bias;

  static BatchLayout full() { return {}; }
  static BatchLayout padded(Tensor seq_lens);
  static BatchLayout padded(const std::vector<int64_t>& seq_lens, Device device);
  // positions may be left undefined: derived from cu_seqlens.
  static BatchLayout packed(Tensor cu_seqlens, Tensor positions = Tensor());
  // Note [Documents within rows]: every row starts a document; i64 [B, T].
  static BatchLayout documents_within_rows(Tensor positions);
  // Documents of the given lengths laid end to end over B rows of T tokens
  // (their sum must be B * T; a document may run on into the next row).
  static BatchLayout packed_documents(const std::vector<int64_t>& doc_lengths, int64_t B, int64_t T,
                                      Device device);

  bool is_padded() const { return seq_lens.defined(); }
  bool is_packed() const { return cu_seqlens.defined(); }
};

class RMSNorm : public Module {
 public:
  // Weight ones [dim].
  RMSNorm(int64_t dim, double eps, const ParamOptions& options);
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }

 private:
  Tensor weight_;
  double eps_;
};

// q/k/v/o_proj (biases when attention_bias), q_norm/k_norm when qk_norm.
class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& config, const ParamOptions& options);
  // x [B, T, hidden]; positions i64 [T] or [B, T] -> [B, T, hidden].
  Tensor forward(const Tensor& x, const Tensor& positions, const BatchLayout& layout) const;
  // For code that runs the layer its own way (a KV cache): the projections,
  // and the QK-norms (nullptr without qk_norm).
  const Linear& q_proj() const { return *q_proj_; }
  const Linear& k_proj() const { return *k_proj_; }
  const Linear& v_proj() const { return *v_proj_; }
  const Linear& o_proj() const { return *o_proj_; }
  const RMSNorm* q_norm() const { return q_norm_; }
  const RMSNorm* k_norm() const { return k_norm_; }

 private:
  LlamaConfig c_;
  Linear *q_proj_, *k_proj_, *v_proj_, *o_proj_;
  RMSNorm *q_norm_ = nullptr, *k_norm_ = nullptr;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLP : public Module {
 public:
  LlamaMLP(const LlamaConfig& config, const ParamOptions& options);
  Tensor forward(const Tensor& x) const;
  const Linear& gate_proj() const { return *gate_proj_; }
  const Linear& up_proj() const { return *up_proj_; }
  const Linear& down_proj() const { return *down_proj_; }

 private:
  Linear *gate_proj_, *up_proj_, *down_proj_;
};

// Note [Llama residual stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As GPT-2's (Note [Fused residual stream]) with RMSNorm: every residual add
// is fused with the norm after it (add_rms_norm): the attention's with
// post_attention_layernorm, the MLP's with the next layer's input_layernorm
// or, after the last layer, the final norm. A layer takes (x,
// input_layernorm(x)) and returns (x', next_norm(x')); only layer 0's
// input_layernorm is a plain rms_norm of the embeddings. x + branch and
// branch + x are the same floating-point sum, so the result equals
// transformers' unfused order bit for bit.
class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, const ParamOptions& options);
  ResidualNorm forward(const Tensor& x, const Tensor& normed, const RMSNorm& next_norm,
                       const Tensor& positions, const BatchLayout& layout) const;
  const RMSNorm& input_layernorm() const { return *input_layernorm_; }
  const LlamaAttention& self_attn() const { return *self_attn_; }
  const RMSNorm& post_attention_layernorm() const { return *post_attention_layernorm_; }
  const LlamaMLP& mlp() const { return *mlp_; }

 private:
  RMSNorm* input_layernorm_;
  LlamaAttention* self_attn_;
  RMSNorm* post_attention_layernorm_;
  LlamaMLP* mlp_;
};

// Note [Llama initialization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As transformers' LlamaPreTrainedModel._init_weights: every Linear weight
// and the embedding normal(0, initializer_range), biases 0, RMSNorm weights 1
// (q_norm and k_norm too). The draws come from the ParamOptions generator in
// registration order (normal_parameter: one randn of the weight's shape),
// nothing drawn for biases and norms. transformers draws from PyTorch's
// stream, which accrue does not reproduce: fixtures start from weights
// transformers wrote (load_hf).
class Llama : public Module {
 public:
  // Parameters carry Hugging Face's names (nn/llama_hf.h):
  // model.embed_tokens.weight, model.layers.{i}...., model.norm.weight, and
  // lm_head.weight when untied; tied, the classifier reads
  // model.embed_tokens.weight, which then gets both gradients.
  Llama(const LlamaConfig& config, const ParamOptions& options);

  // A model built from dir/config.json and loaded with its weights
  // (load_hf_llama_checkpoint; cast to options.dtype on options.device).
  static std::unique_ptr<Llama> from_hf(const std::string& dir, const ParamOptions& options,
                                        bool activation_checkpointing = false);
  // Loads dir's weights into this model through load_state_dict (Note [One
  // load path]); dir's config must describe this architecture (the first
  // field that differs is named).
  void load_hf(const std::string& dir);
  // Writes config.json and the weights (master weights when a ParamStore
  // holds the parameters) as transformers' save_pretrained lays them out.
  void save_hf(const std::string& dir, int64_t max_shard_bytes = kDefaultMaxShardBytes) const;

  const LlamaConfig& config() const { return config_; }
  // Where the parameters are (Module::to moves them).
  Device device() const { return embed_tokens_.device(); }

  // idx [B, T] i32/i64 -> the hidden state after the final norm, [B, T, hidden].
  Tensor forward(const Tensor& idx, const BatchLayout& layout = BatchLayout::full()) const;
  // The next-token loss (sum, count) over targets [B, T] (-100 ignored) through
  // the fused classifier: the fp32 logits never exist (Note [Fused classifier]).
  Loss loss(const Tensor& idx, const Tensor& targets,
            const BatchLayout& layout = BatchLayout::full()) const;
  // For inference and tests: [B, T, vocab] logits in the parameters' dtype.
  Tensor logits(const Tensor& idx, const BatchLayout& layout = BatchLayout::full()) const;

  const Tensor& embed_tokens() const { return embed_tokens_; }
  // lm_head.weight, or embed_tokens when tied (the same tensor).
  const Tensor& head_weight() const { return head_weight_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const LlamaDecoderLayer& layer(int64_t i) const;
  const RMSNorm& norm() const { return *norm_; }

  // Note [FP8 linear]: the decoder layers' projections (q, k, v, o, gate, up,
  // down; those whose sizes are multiples of 16) compute in FP8, the
  // classifier stays in the parameters' dtype. Returns their weights, for
  // optim::ParamStore::keep_fp8_copies (Note [Window FP8 weights]).
  std::vector<Tensor> use_fp8(const Fp8LinearOptions& options = {});

 private:
  void check_inputs(const Tensor& idx, const BatchLayout& layout, const char* op) const;

  LlamaConfig config_;
  Tensor embed_tokens_;
  std::vector<LlamaDecoderLayer*> layers_;
  RMSNorm* norm_;
  Tensor head_weight_;
  Tensor positions_;  // 0 .. max_positions - 1 (at most 2^24), i64 on the device
};

}  // namespace accrue::nn
