#include "accrue/nn/gpt2.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "accrue/autograd/checkpoint.h"
#include "accrue/autograd/parameter_gate.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"

namespace accrue::nn {

namespace {

GPT2Config preset(int64_t n_layer, int64_t n_head, int64_t n_embd) {
  GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  return c;
}

}  // namespace

GPT2Config GPT2Config::d12() {
  return preset(12, 12, 768);
}
GPT2Config GPT2Config::d24() {
  return preset(24, 16, 1024);
}
GPT2Config GPT2Config::d36() {
  return preset(36, 20, 1280);
}
GPT2Config GPT2Config::d48() {
  return preset(48, 25, 1600);
}

GPT2Config GPT2Config::from_name(const std::string& name) {
  if (name == "d12" || name == "gpt2") return d12();
  if (name == "d24" || name == "gpt2-medium") return d24();
  if (name == "d36" || name == "gpt2-large") return d36();
  if (name == "d48" || name == "gpt2-xl") return d48();
  ACCRUE_FAIL("GPT2Config::from_name: unknown model '", name,
              "'; known: d12 (gpt2), d24 (gpt2-medium), d36 (gpt2-large), d48 (gpt2-xl)");
}

namespace {

// The parameter count of `c`, or -1 when it overflows int64 (a config from a
// command line or a file: Note [Checked sizes] in core/tensor.cpp).
int64_t checked_parameter_count(const GPT2Config& c) {
  bool fits = true;
  const auto mul = [&](int64_t x, int64_t y) {
    int64_t r = 0;
    fits = fits && !__builtin_mul_overflow(x, y, &r);
    return r;
  };
  const auto add = [&](std::initializer_list<int64_t> terms) {
    int64_t r = 0;
    for (int64_t t : terms)
      fits = fits && !__builtin_add_overflow(r, t, &r);
    return r;
  };
  const int64_t C = c.n_embd, b = c.bias ? 1 : 0, CC = mul(C, C);
  const int64_t layer_norm = add({C, mul(b, C)});
  const int64_t per_layer = add({mul(2, layer_norm), mul(3, CC), mul(3 * b, C), CC, mul(b, C),
                                 mul(4, CC), mul(4 * b, C), mul(4, CC), mul(b, C)});
  const int64_t total =
      add({mul(c.padded_vocab(), C), mul(c.block_size, C), mul(c.n_layer, per_layer), layer_norm});
  return fits ? total : -1;
}

}  // namespace

int64_t GPT2Config::padded_vocab() const {
  if (padded_vocab_size > 0) return padded_vocab_size;
  return (vocab_size + 127) / 128 * 128;
}

void GPT2Config::validate() const {
  ACCRUE_CHECK(n_layer >= 1, "GPT2Config: n_layer must be >= 1, got ", n_layer);
  ACCRUE_CHECK(n_head >= 1, "GPT2Config: n_head must be >= 1, got ", n_head);
  ACCRUE_CHECK(n_embd >= 1 && n_embd % n_head == 0, "GPT2Config: n_embd ", n_embd,
               " must be a positive multiple of n_head ", n_head);
  ACCRUE_CHECK(block_size >= 1, "GPT2Config: block_size must be >= 1, got ", block_size);
  ACCRUE_CHECK(vocab_size >= 1, "GPT2Config: vocab_size must be >= 1, got ", vocab_size);
  ACCRUE_CHECK(padded_vocab_size == 0 || padded_vocab_size >= vocab_size,
               "GPT2Config: padded_vocab_size ", padded_vocab_size, " is below vocab_size ",
               vocab_size, " (0 picks vocab_size rounded up to a multiple of 128)");
  ACCRUE_CHECK(dropout >= 0.0 && dropout < 1.0, "GPT2Config: dropout ", dropout,
               " must be in [0, 1)");
  ACCRUE_CHECK(layer_norm_eps > 0.0, "GPT2Config: layer_norm_eps must be > 0, got ",
               layer_norm_eps);
  ACCRUE_CHECK(vocab_size <= std::numeric_limits<int64_t>::max() - 127 &&
                   checked_parameter_count(*this) >= 0,
               "GPT2Config: n_layer ", n_layer, ", n_embd ", n_embd, ", vocab_size ", vocab_size,
               ", block_size ", block_size, ": the parameter count overflows int64");
}

int64_t GPT2Config::parameter_count() const {
  validate();
  return checked_parameter_count(*this);
}

GPT2::GPT2(const GPT2Config& config, const ParamOptions& options)
    : config_(config), dropout_generator_(config.dropout_seed) {
  config.validate();
  ACCRUE_CHECK(is_floating(options.dtype), "GPT2: parameters must have a floating dtype, got ",
               dtype_name(options.dtype));
  const int64_t C = config.n_embd, V = config.vocab_size, Vp = config.padded_vocab();
  // See Note [GPT-2 initialization] for the draw order.
  Tensor wte = zeros({Vp, C}, options.dtype, options.device);
  {
    NoGradGuard no_grad;
    wte.narrow(0, 0, V).copy_(normal_parameter({V, C}, 0.02, options));
  }
  wte_ = register_parameter("wte", wte);
  wpe_ = register_parameter("wpe", normal_parameter({config.block_size, C}, 0.02, options));
  BlockOptions bo;
  bo.n_embd = C;
  bo.n_head = config.n_head;
  bo.dropout = config.dropout;
  bo.layer_norm_eps = config.layer_norm_eps;
  bo.bias = config.bias;
  bo.init_std = 0.02;
  bo.residual_init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (int64_t i = 0; i < config.n_layer; ++i) {
    blocks_.push_back(
        &register_module("h." + std::to_string(i), std::make_unique<Block>(bo, options)));
  }
  ln_f_ = &register_module(
      "ln_f", std::make_unique<LayerNorm>(C, options, config.layer_norm_eps, config.bias));
  // Rebuilt from the config, so not saved; a buffer so that Module::to(Device) moves it.
  positions_ = register_buffer(
      "positions",
      arange(0, static_cast<double>(config.block_size), 1.0, DType::i64, options.device),
      BufferOptions().persistent(false));
}

std::vector<Tensor> GPT2::use_fp8(const Fp8LinearOptions& options) {
  return nn::use_fp8_each(blocks_, options);
}

const Block& GPT2::block(int64_t i) const {
  ACCRUE_CHECK(i >= 0 && i < config_.n_layer, "GPT2::block: index ", i, " for a model of ",
               config_.n_layer, " layers");
  return *blocks_[static_cast<size_t>(i)];
}

Tensor GPT2::forward(const Tensor& idx) const {
  const NvtxRange range("accrue GPT-2 forward");  // Note [NVTX ranges]
  ACCRUE_CHECK(idx.defined() && idx.dim() == 2, "GPT2::forward: idx must be [B, T], got ",
               idx.defined() ? shape_str(idx.shape()) : "an undefined tensor");
  ACCRUE_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64,
               "GPT2::forward: idx of shape ", shape_str(idx.shape()), " has dtype ",
               dtype_name(idx.dtype()), "; expected i32 or i64 token ids");
  const int64_t T = idx.size(1);
  ACCRUE_CHECK(T >= 1 && T <= config_.block_size, "GPT2::forward: sequence length T = ", T,
               " must be in [1, block_size = ", config_.block_size, "]");
  ACCRUE_CHECK(idx.device() == device(), "GPT2::forward: idx on ", idx.device().str(),
               ", model on ", device().str());
  Generator* gen = &dropout_generator_;
  const bool train = training();
  // Note [Close under the forward]: each layer's weights, before it reads them.
  accrue::await_parameters({wte_, wpe_});
  await_parameters(blocks_[0]->ln_1());
  const Tensor tokens = embedding(wte_, idx);                            // [B, T, C]
  const Tensor positions = embedding(wpe_, positions_.narrow(0, 0, T));  // [T, C]
  Tensor x = dropout(tokens + positions, config_.dropout, train, gen);
  // Note [Fused residual stream]: (x, ln_1(x)) go from block to block.
  const LayerNorm& ln_1 = blocks_[0]->ln_1();
  Tensor normed = layer_norm(x, ln_1.weight(), ln_1.bias(), ln_1.eps());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block* block = blocks_[i];
    const LayerNorm* next = i + 1 < blocks_.size() ? &blocks_[i + 1]->ln_1() : ln_f_;
    await_parameters(*block);
    await_parameters(*next);
    if (config_.activation_checkpointing && GradMode::is_enabled()) {
      // The block's activations are recomputed in backward from (x, normed).
      std::vector<Tensor> out = checkpoint_multi(
          [block, next, gen](const std::vector<Tensor>& in) {
            ResidualNorm r = block->forward(in[0], in[1], *next, gen);
            return std::vector<Tensor>{r.sum, r.normed};
          },
          {x, normed}, gen);
      x = out[0];
      normed = out[1];
    } else {
      ResidualNorm r = block->forward(x, normed, *next, gen);
      x = r.sum;
      normed = r.normed;
    }
  }
  return normed;
}

Loss GPT2::loss(const Tensor& idx, const Tensor& targets) const {
  ACCRUE_CHECK(targets.defined() && idx.defined() && targets.shape() == idx.shape(),
               "GPT2::loss: targets of shape ",
               targets.defined() ? shape_str(targets.shape()) : "(undefined)",
               " must match idx of shape ", idx.defined() ? shape_str(idx.shape()) : "(undefined)");
  return classifier_cross_entropy(forward(idx), wte_, targets, config_.vocab_size,
                                  /*ignore_index=*/-100);
}

Tensor GPT2::logits(const Tensor& idx) const {
  // Only the real vocabulary's rows of wte: the GEMM skips the padded columns.
  const Tensor w = narrow(wte_, 0, 0, config_.vocab_size);
  return matmul(forward(idx), transpose(w, 0, 1));
}

}  // namespace accrue::nn
