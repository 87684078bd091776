// GPT-2: token and position embeddings, n_layer pre-LayerNorm blocks, a
// final LayerNorm, and an output layer tied to the token embedding.
//
//   nn::GPT2 model(nn::GPT2Config::d12(), {Device::cuda(0), DType::f32, &gen});
//   Loss loss = model.loss(idx, targets);  // idx, targets [B, T]; (sum, count)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/nn/module.h"
#include "accrue/nn/transformer.h"

namespace accrue::nn {

struct GPT2Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;  // the longest sequence (rows of wpe)
  int64_t vocab_size = 50257;
  // Rows of wte, the vocabulary padded so that the classifier's GEMMs tile
  // well; the padded rows are never a target nor part of the softmax.
  // 0: vocab_size rounded up to a multiple of 128 (50257 -> 50304).
  int64_t padded_vocab_size = 0;
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;
  // Each block's forward runs inside checkpoint_multi (Note [Activation checkpointing]).
  bool activation_checkpointing = false;
  bool bias = true;  // Linear and LayerNorm biases
  // The seed of the model's dropout generator.
  uint64_t dropout_seed = 0;

  // The four GPT-2 sizes: 124M, 350M, 774M and 1.5B parameters.
  static GPT2Config d12();
  static GPT2Config d24();
  static GPT2Config d36();
  static GPT2Config d48();
  // "d12" or "gpt2", "d24" or "gpt2-medium", "d36" or "gpt2-large", "d48" or "gpt2-xl".
  static GPT2Config from_name(const std::string& name);

  // The rows of wte: padded_vocab_size, or its default.
  int64_t padded_vocab() const;
  // Throws accrue::Error naming the offending values.
  void validate() const;
  // The parameters the model has, without building it.
  int64_t parameter_count() const;
};

// Note [GPT-2 initialization]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As GPT-2: Linear weights and both embeddings normal(0, 0.02), the two
// projections into the residual stream (attn.c_proj.weight, mlp.c_proj.weight)
// normal(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm weights 1 and
// biases 0, and the padded rows of wte 0. The draws come from the
// ParamOptions generator in registration order, one randn draw per weight of
// its shape (see normal_parameter), nothing drawn for biases, LayerNorms and
// wte's padded rows: wte [vocab_size, C], wpe [block_size, C], then per
// layer c_attn [3C, C], attn.c_proj [C, C], c_fc [4C, C], mlp.c_proj [C, 4C].
// A seed gives the same model on every device and dtype; nothing else (e.g.
// PyTorch) reproduces the stream, so fixtures start from accrue's weights.
class GPT2 : public Module {
 public:
  // Parameters, in this order (the arena's layout and a checkpoint's names):
  // wte [padded_vocab, C], wpe [block_size, C], h.{i}.ln_1.{weight,bias},
  // h.{i}.attn.c_attn.{weight [3C, C], bias}, h.{i}.attn.c_proj.{weight [C, C],
  // bias}, h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight [4C, C], bias},
  // h.{i}.mlp.c_proj.{weight [C, 4C], bias}, ln_f.{weight,bias}. Weights are
  // [out, in]. wte is registered once and used twice: by the embedding and by
  // the classifier (tied), so its gradient is the sum of both.
  GPT2(const GPT2Config& config, const ParamOptions& options);

  const GPT2Config& config() const { return config_; }
  // Where the parameters are (Module::to moves them).
  Device device() const { return wte_.device(); }

  // idx [B, T] i32/i64 token ids, T <= block_size -> the hidden state after
  // ln_f, [B, T, C] in the parameters' dtype.
  Tensor forward(const Tensor& idx) const;
  // The next-token loss (sum, count) over targets [B, T] (ignore_index -100)
  // through the fused classifier: fp32 logits never exist (Note [Fused classifier]).
  Loss loss(const Tensor& idx, const Tensor& targets) const;
  // For inference: [B, T, vocab_size] logits (hidden @ wte[:vocab_size]^T).
  Tensor logits(const Tensor& idx) const;

  const Tensor& wte() const { return wte_; }
  const Tensor& wpe() const { return wpe_; }
  const Block& block(int64_t i) const;
  // Note [FP8 linear]: the blocks' projections (c_attn, attn.c_proj, c_fc,
  // mlp.c_proj) compute in FP8; the tied embedding and classifier stay in the
  // parameters' dtype. Returns their weights, for
  // optim::ParamStore::keep_fp8_copies (Note [Window FP8 weights]).
  std::vector<Tensor> use_fp8(const Fp8LinearOptions& options = {});
  const LayerNorm& ln_f() const { return *ln_f_; }
  // Dropout's stream (seeded with config.dropout_seed); checkpointing rewinds
  // it in backward, so the masks are the forward's.
  Generator& dropout_generator() const { return dropout_generator_; }

 private:
  GPT2Config config_;
  Tensor wte_, wpe_;
  std::vector<Block*> blocks_;
  LayerNorm* ln_f_;
  Tensor positions_;  // 0 .. block_size - 1, i64 on the device
  mutable Generator dropout_generator_;
};

}  // namespace accrue::nn
