// The GPT-2 transformer block and its two branches: causal self-attention and
// the MLP, around a pre-LayerNorm residual stream.
#pragma once

#include <cstdint>
#include <memory>

#include "accrue/autograd/transformer_ops.h"
#include "accrue/nn/module.h"

namespace accrue::nn {

// What a block is made of: sizes, dropout and initialization (Note [GPT-2
// initialization] in nn/gpt2.h).
struct BlockOptions {
  int64_t n_embd = 768;
  int64_t n_head = 12;
  double dropout = 0.0;  // attention probabilities and both residual branches
  double layer_norm_eps = 1e-5;
  bool bias = true;  // Linear and LayerNorm biases
  double init_std = 0.02;
  // The projections into the residual stream (attn.c_proj, mlp.c_proj):
  // 0.02 / sqrt(2 * n_layer) in GPT-2.
  double residual_init_std = 0.02;
};

// normal(0, std) of `shape`: one randn draw of that shape from
// options.generator, in f64 on the CPU (so every device and dtype starts from
// the same values), scaled, then cast to options.dtype on options.device.
Tensor normal_parameter(const Shape& shape, double std, const ParamOptions& options);

// A Linear [out, in] with GPT-2's initialization: weight normal(0, std), bias zeros.
std::unique_ptr<Linear> normal_linear(int64_t in_features, int64_t out_features, bool bias,
                                      double std, const ParamOptions& options);

// c_attn [3C, C] -> packed causal attention over n_head heads -> c_proj [C, C]
// -> dropout. Parameters: c_attn.{weight,bias}, c_proj.{weight,bias}.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const BlockOptions& config, const ParamOptions& options);
  // x [B, T, C] -> [B, T, C]. Dropout (when training) draws from generator.
  Tensor forward(const Tensor& x, Generator* generator) const;
  const Linear& c_attn() const { return *c_attn_; }
  const Linear& c_proj() const { return *c_proj_; }

 private:
  Linear* c_attn_;
  Linear* c_proj_;
  int64_t n_head_;
  double dropout_;
};

// GPT-2's MLP: c_fc [4C, C] fused with GELU -> c_proj [C, 4C] -> dropout.
// Parameters: c_fc.{weight,bias}, c_proj.{weight,bias}.
class TransformerMLP : public Module {
 public:
  TransformerMLP(const BlockOptions& config, const ParamOptions& options);
  Tensor forward(const Tensor& x, Generator* generator) const;
  const Linear& c_fc() const { return *c_fc_; }
  const Linear& c_proj() const { return *c_proj_; }

 private:
  Linear* c_fc_;
  Linear* c_proj_;
  double dropout_;
};

// Note [Fused residual stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pre-LN block is x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), and the
// model ends with ln_f(x). Every residual add is fused with the LayerNorm
// that follows it (residual_layer_norm): the attention's add with ln_2, the
// MLP's add with the next block's ln_1 or, after the last block, with ln_f.
// So a block takes the stream and its normalized copy (x, ln_1(x)) and
// returns the next pair (x', next_norm(x')); only block 0's ln_1 is a plain
// layer_norm, after the embeddings' dropout. Both tensors cross every block
// boundary, which is why a checkpointed block has two outputs
// (checkpoint_multi).
class Block : public Module {
 public:
  Block(const BlockOptions& config, const ParamOptions& options);
  // x: the residual stream [B, T, C]; normed: ln_1(x). next_norm: the
  // LayerNorm after this block (the next block's ln_1, or ln_f).
  ResidualNorm forward(const Tensor& x, const Tensor& normed, const LayerNorm& next_norm,
                       Generator* generator) const;
  const LayerNorm& ln_1() const { return *ln_1_; }
  const LayerNorm& ln_2() const { return *ln_2_; }
  const CausalSelfAttention& attn() const { return *attn_; }
  const TransformerMLP& mlp() const { return *mlp_; }

 private:
  LayerNorm* ln_1_;
  CausalSelfAttention* attn_;
  LayerNorm* ln_2_;
  TransformerMLP* mlp_;
};

}  // namespace accrue::nn
