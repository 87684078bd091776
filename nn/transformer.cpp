#include "accrue/nn/transformer.h"

#include <cmath>
#include <utility>

#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/ops.h"

namespace accrue::nn {

namespace {

void check_block_options(const BlockOptions& c) {
  ACCRUE_CHECK(c.n_embd > 0 && c.n_head > 0 && c.n_embd % c.n_head == 0,
               "transformer block: n_embd ", c.n_embd, " must be a positive multiple of n_head ",
               c.n_head);
  ACCRUE_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "transformer block: dropout ", c.dropout,
               " must be in [0, 1)");
}

// The linear layer GELU follows: one fused op when there is a bias (its GEMM
// epilogue adds it and applies GELU, FP8 or not), else linear then gelu.
Tensor linear_then_gelu(const Linear& fc, const Tensor& x) {
  return fc.forward_gelu(x);
}

}  // namespace

Tensor normal_parameter(const Shape& shape, double std, const ParamOptions& options) {
  // Drawn and scaled on the parameter's own device: Philox gives the same
  // normals on the CPU and every GPU (Note [Philox element mapping]), and one
  // host thread needs minutes to draw the 1.5B values of GPT-2 d48 (most of
  // the 168 s a d48 benchmark run took with host draws, for 5 s of training).
  NoGradGuard no_grad;
  const Tensor n = randn(shape, DType::f64, options.device, options.generator);
  return kernels::binary_scalar(kernels::BinaryOp::Mul, n, std).to(options.dtype);
}

std::unique_ptr<Linear> normal_linear(int64_t in_features, int64_t out_features, bool bias,
                                      double std, const ParamOptions& options) {
  ACCRUE_CHECK(in_features > 0 && out_features > 0, "Linear: invalid sizes in=", in_features,
               " out=", out_features);
  Tensor w = normal_parameter({out_features, in_features}, std, options);
  Tensor b = bias ? zeros({out_features}, options.dtype, options.device) : Tensor();
  return std::make_unique<Linear>(std::move(w), std::move(b));
}

CausalSelfAttention::CausalSelfAttention(const BlockOptions& c, const ParamOptions& options)
    : n_head_(c.n_head), dropout_(c.dropout) {
  check_block_options(c);
  c_attn_ = &register_module("c_attn",
                             normal_linear(c.n_embd, 3 * c.n_embd, c.bias, c.init_std, options));
  c_proj_ = &register_module(
      "c_proj", normal_linear(c.n_embd, c.n_embd, c.bias, c.residual_init_std, options));
}

Tensor CausalSelfAttention::forward(const Tensor& x, Generator* generator) const {
  const NvtxRange range("accrue attention forward");  // Note [NVTX ranges]
  AttentionOptions options;
  options.causal = true;
  options.dropout_p = training() ? dropout_ : 0.0;
  options.generator = generator;
  Tensor y = packed_causal_attention(c_attn_->forward(x), n_head_, options);
  return dropout(c_proj_->forward(y), dropout_, training(), generator);
}

TransformerMLP::TransformerMLP(const BlockOptions& c, const ParamOptions& options)
    : dropout_(c.dropout) {
  check_block_options(c);
  c_fc_ =
      &register_module("c_fc", normal_linear(c.n_embd, 4 * c.n_embd, c.bias, c.init_std, options));
  c_proj_ = &register_module(
      "c_proj", normal_linear(4 * c.n_embd, c.n_embd, c.bias, c.residual_init_std, options));
}

Tensor TransformerMLP::forward(const Tensor& x, Generator* generator) const {
  const NvtxRange range("accrue MLP forward");  // Note [NVTX ranges]
  // Plain layers with biases run as one node, whose backward takes GELU's
  // gradient in a GEMM epilogue (Note [GELU gradient epilogue]); FP8 layers
  // and bias-free ones as their two ops.
  const bool fused =
      !c_fc_->fp8() && !c_proj_->fp8() && c_fc_->bias().defined() && c_proj_->bias().defined();
  const Tensor y = fused ? linear_gelu_linear(x, c_fc_->weight(), c_fc_->bias(), c_proj_->weight(),
                                              c_proj_->bias())
                         : c_proj_->forward(linear_then_gelu(*c_fc_, x));
  return dropout(y, dropout_, training(), generator);
}

Block::Block(const BlockOptions& c, const ParamOptions& options) {
  check_block_options(c);
  ln_1_ = &register_module(
      "ln_1", std::make_unique<LayerNorm>(c.n_embd, options, c.layer_norm_eps, c.bias));
  attn_ = &register_module("attn", std::make_unique<CausalSelfAttention>(c, options));
  ln_2_ = &register_module(
      "ln_2", std::make_unique<LayerNorm>(c.n_embd, options, c.layer_norm_eps, c.bias));
  mlp_ = &register_module("mlp", std::make_unique<TransformerMLP>(c, options));
}

ResidualNorm Block::forward(const Tensor& x, const Tensor& normed, const LayerNorm& next_norm,
                            Generator* generator) const {
  const NvtxRange range("accrue GPT-2 block forward");  // Note [NVTX ranges]
  // See Note [Fused residual stream].
  const ResidualNorm h = residual_layer_norm(attn_->forward(normed, generator), x, ln_2_->weight(),
                                             ln_2_->bias(), ln_2_->eps());
  return residual_layer_norm(mlp_->forward(h.normed, generator), h.sum, next_norm.weight(),
                             next_norm.bias(), next_norm.eps());
}

}  // namespace accrue::nn
