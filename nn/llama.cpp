#include "accrue/nn/llama.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/checkpoint.h"
#include "accrue/autograd/parameter_gate.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/nvtx.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/llama_hf.h"
#include "accrue/nn/transformer.h"

namespace accrue::nn {

namespace {

std::string describe(const Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream s;
  s << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << " on " << t.device().str();
  return s.str();
}

// The kernels' rotary scaling from the config's (Note [Rotary embedding]).
accrue::RopeScaling kernel_scaling(const nn::RopeScaling& r) {
  if (r.type == nn::RopeScaling::Type::none) return {};
  return accrue::RopeScaling::llama3(r.factor, r.low_freq_factor, r.high_freq_factor,
                                     r.original_max_position_embeddings);
}

// Holds the token embedding as "weight" under "embed_tokens", drawn on the
// device (normal_parameter): a 128k-row table drawn on the host takes seconds.
class TokenEmbedding : public Module {
 public:
  TokenEmbedding(int64_t vocab, int64_t hidden, double std, const ParamOptions& options) {
    weight_ = register_parameter("weight", normal_parameter({vocab, hidden}, std, options));
  }
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

// transformers' LlamaModel: the parameters under "model.".
class LlamaBody : public Module {
 public:
  LlamaBody(const LlamaConfig& c, const ParamOptions& options) {
    embed_ = &register_module(
        "embed_tokens",
        std::make_unique<TokenEmbedding>(c.vocab_size, c.hidden, c.initializer_range, options));
    for (int64_t i = 0; i < c.layers; ++i)
      layers.push_back(&register_module("layers." + std::to_string(i),
                                        std::make_unique<LlamaDecoderLayer>(c, options)));
    norm = &register_module("norm", std::make_unique<RMSNorm>(c.hidden, c.rms_eps, options));
  }
  const Tensor& embed_weight() const { return embed_->weight(); }
  std::vector<LlamaDecoderLayer*> layers;
  RMSNorm* norm;

 private:
  TokenEmbedding* embed_;
};

// The architecture fields of two configs, the first that differs named
// (what a checkpoint's weights mean depends on all of them).
void check_same_architecture(const LlamaConfig& mine, const LlamaConfig& theirs,
                             const std::string& dir) {
  auto field = [&](const char* name, auto a, auto b) {
    ACCRUE_CHECK(a == b, "Llama::load_hf: ", dir, "/config.json has ", name, " = ", b,
                 " where this model has ", a);
  };
  field("vocab_size", mine.vocab_size, theirs.vocab_size);
  field("hidden_size", mine.hidden, theirs.hidden);
  field("intermediate_size", mine.intermediate, theirs.intermediate);
  field("num_hidden_layers", mine.layers, theirs.layers);
  field("num_attention_heads", mine.heads, theirs.heads);
  field("num_key_value_heads", mine.kv_heads, theirs.kv_heads);
  field("head_dim", mine.head_dim, theirs.head_dim);
  field("rope_theta", mine.rope_theta, theirs.rope_theta);
  field("rope_scaling (llama3)", mine.rope_scaling.type == nn::RopeScaling::Type::llama3,
        theirs.rope_scaling.type == nn::RopeScaling::Type::llama3);
  if (mine.rope_scaling.type == nn::RopeScaling::Type::llama3) {
    field("rope_scaling.factor", mine.rope_scaling.factor, theirs.rope_scaling.factor);
    field("rope_scaling.low_freq_factor", mine.rope_scaling.low_freq_factor,
          theirs.rope_scaling.low_freq_factor);
    field("rope_scaling.high_freq_factor", mine.rope_scaling.high_freq_factor,
          theirs.rope_scaling.high_freq_factor);
    field("rope_scaling.original_max_position_embeddings",
          mine.rope_scaling.original_max_position_embeddings,
          theirs.rope_scaling.original_max_position_embeddings);
  }
  field("rms_norm_eps", mine.rms_eps, theirs.rms_eps);
  field("tie_word_embeddings", mine.tie_word_embeddings, theirs.tie_word_embeddings);
  field("qk_norm (model_type qwen3)", mine.qk_norm, theirs.qk_norm);
  field("attention_bias", mine.attention_bias, theirs.attention_bias);
}

// The checkpoint's tensors as the model's state dict: a tied model has no
// lm_head.weight (check_hf_llama_tensors allowed only an exact copy of the
// embedding), and rotary buffers of older files are not state.
std::map<std::string, Tensor> state_of(HFLlamaCheckpoint& ckpt) {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : ckpt.tensors) {
    if (is_hf_llama_buffer(name)) continue;
    if (ckpt.config.tie_word_embeddings && name == "lm_head.weight") continue;
    state.emplace(name, std::move(t));
  }
  return state;
}

}  // namespace

Tensor positions_from_cu_seqlens(const Tensor& cu_seqlens, int64_t B, int64_t T) {
  // See Note [Positions from document offsets].
  NoGradGuard no_grad;
  const int64_t n = B * T, N = cu_seqlens.size(0) - 1;
  const Device d = cu_seqlens.device();
  const Tensor boundaries = cu_seqlens.narrow(0, 1, N);
  const Tensor marks = kernels::index_add(zeros({n + 1}, DType::i64, d), 0, boundaries,
                                          full({N}, 1.0, DType::i64, d));
  const Tensor doc = kernels::cumsum(marks.narrow(0, 0, n), 0);
  const Tensor start = kernels::index_select(cu_seqlens, 0, doc);
  const Tensor t = arange(0, static_cast<double>(n), 1.0, DType::i64, d);
  // t - start as an integer scatter (elementwise kernels take floating dtypes).
  return kernels::index_add(t, 0, t, start, -1.0).reshape({B, T});
}

BatchLayout BatchLayout::padded(Tensor seq_lens) {
  BatchLayout l;
  l.seq_lens = std::move(seq_lens);
  return l;
}

BatchLayout BatchLayout::padded(const std::vector<int64_t>& seq_lens, Device device) {
  return padded(
      from_vector<int64_t>(seq_lens, {static_cast<int64_t>(seq_lens.size())}, DType::i64, device));
}

BatchLayout BatchLayout::packed(Tensor cu_seqlens, Tensor positions) {
  BatchLayout l;
  l.cu_seqlens = std::move(cu_seqlens);
  l.positions = std::move(positions);
  return l;
}

// Note [Documents within rows]
BatchLayout BatchLayout::documents_within_rows(Tensor positions) {
  ACCRUE_CHECK(positions.defined(), "BatchLayout::documents_within_rows: needs the positions");
  BatchLayout l;
  l.positions = std::move(positions);
  l.within_rows = true;
  return l;
}

namespace {

// Note [Documents within rows]: [B, 1, T, T] of 0 where tokens i and j of a
// row share a document (the same start, t - position), -inf elsewhere.
Tensor document_bias(const Tensor& positions, DType dtype) {
  NoGradGuard no_grad;
  const int64_t B = positions.size(0), T = positions.size(1);
  // In f32, whose integers are exact below 2^24 (the elementwise ops take floats).
  ACCRUE_CHECK(T < (int64_t{1} << 24), "Llama: documents within rows of ", T,
               " tokens; at most 2^24 - 1");
  const Tensor t = arange(0.0, static_cast<double>(T), 1.0, DType::f32, positions.device());
  const Tensor starts = kernels::binary(kernels::BinaryOp::Sub, t.view({1, T}),
                                        positions.to(DType::f32));  // [B, T]
  const Tensor same = kernels::compare(kernels::CompareOp::Eq, starts.view({B, 1, T, 1}),
                                       starts.view({B, 1, 1, T}));
  return kernels::where(
      same, 0.0, full({}, -std::numeric_limits<double>::infinity(), dtype, positions.device()));
}

}  // namespace

BatchLayout BatchLayout::packed_documents(const std::vector<int64_t>& doc_lengths, int64_t B,
                                          int64_t T, Device device) {
  ACCRUE_CHECK(B >= 1 && T >= 1, "BatchLayout::packed_documents: B = ", B, ", T = ", T,
               " must be >= 1");
  ACCRUE_CHECK(!doc_lengths.empty(), "BatchLayout::packed_documents: no documents");
  std::vector<int64_t> cu{0}, positions;
  positions.reserve(static_cast<size_t>(B * T));
  for (size_t n = 0; n < doc_lengths.size(); ++n) {
    const int64_t len = doc_lengths[n];
    ACCRUE_CHECK(len >= 1 && len <= B * T - cu.back(), "BatchLayout::packed_documents: document ",
                 n, " has length ", len, " with ", B * T - cu.back(), " of the B * T = ", B * T,
                 " tokens left");
    for (int64_t p = 0; p < len; ++p)
      positions.push_back(p);
    cu.push_back(cu.back() + len);
  }
  ACCRUE_CHECK(cu.back() == B * T, "BatchLayout::packed_documents: the documents hold ", cu.back(),
               " tokens, B * T = ", B * T);
  return packed(from_vector<int64_t>(cu, {static_cast<int64_t>(cu.size())}, DType::i64, device),
                from_vector<int64_t>(positions, {B, T}, DType::i64, device));
}

RMSNorm::RMSNorm(int64_t dim, double eps, const ParamOptions& options) : eps_(eps) {
  ACCRUE_CHECK(dim >= 1 && eps > 0.0, "RMSNorm: dim ", dim, " must be >= 1 and eps ", eps, " > 0");
  weight_ = register_parameter("weight", full({dim}, 1.0, options.dtype, options.device));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  return rms_norm(x, weight_, eps_);
}

LlamaAttention::LlamaAttention(const LlamaConfig& c, const ParamOptions& options) : c_(c) {
  const int64_t D = c.head_dim;
  const double s = c.initializer_range;
  const bool b = c.attention_bias;
  q_proj_ = &register_module("q_proj", normal_linear(c.hidden, c.heads * D, b, s, options));
  k_proj_ = &register_module("k_proj", normal_linear(c.hidden, c.kv_heads * D, b, s, options));
  v_proj_ = &register_module("v_proj", normal_linear(c.hidden, c.kv_heads * D, b, s, options));
  o_proj_ = &register_module("o_proj", normal_linear(c.heads * D, c.hidden, b, s, options));
  if (c.qk_norm) {
    q_norm_ = &register_module("q_norm", std::make_unique<RMSNorm>(D, c.rms_eps, options));
    k_norm_ = &register_module("k_norm", std::make_unique<RMSNorm>(D, c.rms_eps, options));
  }
}

Tensor LlamaAttention::forward(const Tensor& x, const Tensor& positions,
                               const BatchLayout& layout) const {
  const NvtxRange range("accrue Llama attention forward");  // Note [NVTX ranges]
  const int64_t B = x.size(0), T = x.size(1), D = c_.head_dim, H = c_.heads, G = c_.kv_heads;
  const accrue::RopeScaling scaling = kernel_scaling(c_.rope_scaling);
  // [B, T, n, D] views of the projections; q and k normalized per head
  // (Qwen3) and rotated. Packed documents attend as one sequence of B * T
  // tokens cut by cu_seqlens (varlen wants B == 1): the reshape is free.
  // Note [Documents within rows]: with the forward's bias, per row.
  const bool within = layout.document_bias.defined();
  const bool packed = layout.is_packed();
  const int64_t Ba = packed ? 1 : B, Ta = packed ? B * T : T;
  // Note [FP8 shared input]: q, k and v read x's codes from one cast.
  const std::optional<Fp8Input> x8 = Linear::shared_fp8_input({q_proj_, k_proj_, v_proj_}, x);
  auto heads = [&](const Linear& proj, int64_t n, const RMSNorm* norm) {
    Tensor h = reshape(proj.forward(x, x8 ? &*x8 : nullptr), {B, T, n, D});
    if (norm != nullptr) h = qk_norm(h, norm->weight(), norm->eps());
    if (&proj != v_proj_) h = rope(h, positions, c_.rope_theta, RopeStyle::RotateHalf, scaling);
    if (packed) h = reshape(h, {Ba, Ta, n, D});
    return transpose(h, 1, 2);  // [Ba, n, Ta, D]
  };
  SdpaOptions o;
  o.causal();
  if (packed) o.varlen(layout.cu_seqlens);
  if (within) o.bias(layout.document_bias);
  if (layout.is_padded()) o.seq_lens(layout.seq_lens);
  // Grouped-query heads stay unexpanded: kv head j serves query heads
  // j * H / G .. (j + 1) * H / G - 1.
  const Tensor out = scaled_dot_product_attention(
      heads(*q_proj_, H, q_norm_), heads(*k_proj_, G, k_norm_), heads(*v_proj_, G, nullptr), o);
  return o_proj_->forward(reshape(transpose(out, 1, 2), {B, T, H * D}));
}

LlamaMLP::LlamaMLP(const LlamaConfig& c, const ParamOptions& options) {
  const double s = c.initializer_range;
  gate_proj_ =
      &register_module("gate_proj", normal_linear(c.hidden, c.intermediate, false, s, options));
  up_proj_ =
      &register_module("up_proj", normal_linear(c.hidden, c.intermediate, false, s, options));
  down_proj_ =
      &register_module("down_proj", normal_linear(c.intermediate, c.hidden, false, s, options));
}

Tensor LlamaMLP::forward(const Tensor& x) const {
  const NvtxRange range("accrue Llama MLP forward");  // Note [NVTX ranges]
  // Note [FP8 shared input]: gate and up read x's codes from one cast.
  const std::optional<Fp8Input> x8 = Linear::shared_fp8_input({gate_proj_, up_proj_}, x);
  const Fp8Input* shared = x8 ? &*x8 : nullptr;
  return down_proj_->forward(swiglu(gate_proj_->forward(x, shared), up_proj_->forward(x, shared)));
}

std::vector<Tensor> Llama::use_fp8(const Fp8LinearOptions& options) {
  return nn::use_fp8_each(layers_, options);
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, const ParamOptions& options) {
  // transformers' registration order (its state_dict's, and the arena's layout).
  self_attn_ = &register_module("self_attn", std::make_unique<LlamaAttention>(c, options));
  mlp_ = &register_module("mlp", std::make_unique<LlamaMLP>(c, options));
  input_layernorm_ =
      &register_module("input_layernorm", std::make_unique<RMSNorm>(c.hidden, c.rms_eps, options));
  post_attention_layernorm_ = &register_module(
      "post_attention_layernorm", std::make_unique<RMSNorm>(c.hidden, c.rms_eps, options));
}

ResidualNorm LlamaDecoderLayer::forward(const Tensor& x, const Tensor& normed,
                                        const RMSNorm& next_norm, const Tensor& positions,
                                        const BatchLayout& layout) const {
  const NvtxRange range("accrue Llama layer forward");  // Note [NVTX ranges]
  // See Note [Llama residual stream].
  const ResidualNorm h =
      add_rms_norm(self_attn_->forward(normed, positions, layout), x,
                   post_attention_layernorm_->weight(), post_attention_layernorm_->eps());
  return add_rms_norm(mlp_->forward(h.normed), h.sum, next_norm.weight(), next_norm.eps());
}

Llama::Llama(const LlamaConfig& config, const ParamOptions& options) : config_(config) {
  config.validate();
  ACCRUE_CHECK(is_floating(options.dtype), "Llama: parameters must have a floating dtype, got ",
               dtype_name(options.dtype));
  // See Note [Llama initialization] for the draw order.
  LlamaBody& body = register_module("model", std::make_unique<LlamaBody>(config, options));
  embed_tokens_ = body.embed_weight();
  layers_ = body.layers;
  norm_ = body.norm;
  if (config.tie_word_embeddings) {
    head_weight_ = embed_tokens_;
  } else {
    head_weight_ = register_module("lm_head", normal_linear(config.hidden, config.vocab_size, false,
                                                            config.initializer_range, options))
                       .weight();
  }
  // Rebuilt from the config, so not saved; a buffer so that Module::to moves
  // it. Capped where rope stops (a 131072-position table is 1 MiB).
  const int64_t P = std::min(config.max_positions, int64_t{1} << 24);
  positions_ = register_buffer("positions",
                               arange(0, static_cast<double>(P), 1.0, DType::i64, options.device),
                               BufferOptions().persistent(false));
}

const LlamaDecoderLayer& Llama::layer(int64_t i) const {
  ACCRUE_CHECK(i >= 0 && i < num_layers(), "Llama::layer: index ", i, " for a model of ",
               num_layers(), " layers");
  return *layers_[static_cast<size_t>(i)];
}

std::unique_ptr<Llama> Llama::from_hf(const std::string& dir, const ParamOptions& options,
                                      bool activation_checkpointing) {
  HFLlamaCheckpoint ckpt = load_hf_llama_checkpoint(dir);
  LlamaConfig c = ckpt.config;
  c.activation_checkpointing = activation_checkpointing;
  auto model = std::make_unique<Llama>(c, options);
  model->load_state_dict(state_of(ckpt));
  return model;
}

void Llama::load_hf(const std::string& dir) {
  HFLlamaCheckpoint ckpt = load_hf_llama_checkpoint(dir);
  check_same_architecture(config_, ckpt.config, dir);
  load_state_dict(state_of(ckpt));
}

void Llama::save_hf(const std::string& dir, int64_t max_shard_bytes) const {
  // One dtype in the file, the embedding's: a store keeps FP8 layers' weights
  // at their f32 masters, which its compute copy held rounded to it (Note
  // [FP8 codes in the compute slots], optim/fp8_weights.h).
  const DType dtype = embed_tokens_.dtype();
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : state_dict()) {
    Tensor v = detach(t);
    if (is_floating(v.dtype()) && v.dtype() != dtype) v = v.to(dtype);
    state.emplace(name, v.device().is_cpu() ? v : v.to(Device::cpu()));
  }
  save_hf_llama_checkpoint(dir, config_, state, max_shard_bytes);
}

void Llama::check_inputs(const Tensor& idx, const BatchLayout& layout, const char* op) const {
  ACCRUE_CHECK(idx.defined() && idx.dim() == 2, op, ": idx must be [B, T], got ", describe(idx));
  ACCRUE_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64, op,
               ": idx must hold i32 or i64 token ids, got ", describe(idx));
  ACCRUE_CHECK(idx.device() == device(), op, ": idx on ", idx.device().str(), ", model on ",
               device().str());
  const int64_t B = idx.size(0), T = idx.size(1);
  ACCRUE_CHECK(B >= 1 && T >= 1, op, ": empty batch ", shape_str(idx.shape()));
  ACCRUE_CHECK(!(layout.is_padded() && layout.is_packed()), op,
               ": a layout is either padded (seq_lens) or packed (cu_seqlens), not both");
  auto on_device = [&](const Tensor& t) { return t.device().is_cpu() || t.device() == device(); };
  if (layout.is_padded()) {
    const Tensor& l = layout.seq_lens;
    ACCRUE_CHECK(l.dtype() == DType::i64 && l.dim() == 1 && l.size(0) == B && on_device(l), op,
                 ": seq_lens must be i64 [B = ", B, "] on the CPU or ", device().str(), ", got ",
                 describe(l));
    if (l.device().is_cpu()) {
      const std::vector<int64_t> v = l.contiguous().to_vector<int64_t>();
      for (size_t b = 0; b < v.size(); ++b)
        ACCRUE_CHECK(v[b] >= 0 && v[b] <= T, op, ": seq_lens[", b, "] = ", v[b],
                     " outside [0, T = ", T, "]");
    }
  }
  if (layout.is_packed()) {
    const Tensor &cu = layout.cu_seqlens, &p = layout.positions;
    ACCRUE_CHECK(cu.dtype() == DType::i64 && cu.dim() == 1 && cu.size(0) >= 2 && on_device(cu), op,
                 ": cu_seqlens must be i64 [documents + 1] on the CPU or ", device().str(),
                 ", got ", describe(cu));
    ACCRUE_CHECK(!p.defined() || (p.dtype() == DType::i64 && (p.shape() == Shape{B, T}) &&
                                  p.device() == device()),
                 op, ": a packed layout's positions must be i64 [B = ", B, ", T = ", T, "] on ",
                 device().str(), ", got ", describe(p));
    if (cu.device().is_cpu()) {
      const std::vector<int64_t> v = cu.contiguous().to_vector<int64_t>();
      ACCRUE_CHECK(v.front() == 0 && v.back() == B * T, op, ": cu_seqlens runs from ", v.front(),
                   " to ", v.back(), "; it must run from 0 to B * T = ", B * T);
      for (size_t n = 1; n < v.size(); ++n)
        ACCRUE_CHECK(v[n] >= v[n - 1], op, ": cu_seqlens decreases at ", n, ": ", v[n - 1],
                     " then ", v[n]);
    }
  } else if (layout.within_rows) {
    // Note [Documents within rows]
    const Tensor& p = layout.positions;
    ACCRUE_CHECK(!layout.is_padded() && p.defined() && p.dtype() == DType::i64 &&
                     (p.shape() == Shape{B, T}) && p.device() == device(),
                 op, ": documents within rows need i64 positions [B = ", B, ", T = ", T, "] on ",
                 device().str(), " and nothing else, got ", describe(p));
    if (p.device().is_cpu()) {
      const std::vector<int64_t> v = p.contiguous().to_vector<int64_t>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t at = v[static_cast<size_t>(b * T + t)];
          const int64_t before = t == 0 ? -1 : v[static_cast<size_t>(b * T + t - 1)];
          ACCRUE_CHECK(at == 0 || at == before + 1, op, ": documents within rows, but row ", b,
                       " has position ", at, " at token ", t, " after ", before,
                       " (each row starts at 0, then counts up by one or restarts at 0; a "
                       "document across rows stays packed)");
        }
    }
    ACCRUE_CHECK(T <= positions_.size(0), op, ": sequence length T = ", T,
                 " exceeds max_position_embeddings = ", positions_.size(0));
  } else {
    ACCRUE_CHECK(!layout.positions.defined(), op,
                 ": positions are given only with a packed layout (cu_seqlens) or documents "
                 "within rows");
    ACCRUE_CHECK(T <= positions_.size(0), op, ": sequence length T = ", T,
                 " exceeds max_position_embeddings = ", positions_.size(0));
  }
}

Tensor Llama::forward(const Tensor& idx, const BatchLayout& layout) const {
  const NvtxRange range("accrue Llama forward");  // Note [NVTX ranges]
  check_inputs(idx, layout, "Llama::forward");
  const int64_t T = idx.size(1);
  Tensor positions = positions_.narrow(0, 0, T);
  if (layout.within_rows) positions = layout.positions;
  if (layout.is_packed()) {
    positions = layout.positions.defined()
                    ? layout.positions
                    : positions_from_cu_seqlens(layout.cu_seqlens, idx.size(0), T).to(device());
  }
  // Note [Close under the forward]: each layer's weights, before it reads them.
  accrue::await_parameters({embed_tokens_});
  await_parameters(layers_[0]->input_layernorm());
  const Tensor x0 = embedding(embed_tokens_, idx);  // [B, T, hidden]
  BatchLayout within = layout;  // Note [Documents within rows]: the bias, once per forward
  if (layout.within_rows) within.document_bias = document_bias(positions, x0.dtype());
  // Note [Llama residual stream]: (x, input_layernorm(x)) go from layer to layer.
  Tensor x = x0;
  Tensor normed = layers_[0]->input_layernorm().forward(x0);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LlamaDecoderLayer* layer = layers_[i];
    const RMSNorm* next = i + 1 < layers_.size() ? &layers_[i + 1]->input_layernorm() : norm_;
    await_parameters(*layer);
    await_parameters(*next);
    if (config_.activation_checkpointing && GradMode::is_enabled()) {
      // The layer's activations are recomputed in backward from (x, normed);
      // positions and the layout are integers, outside the graph.
      std::vector<Tensor> out = checkpoint_multi(
          [layer, next, positions, within](const std::vector<Tensor>& in) {
            ResidualNorm r = layer->forward(in[0], in[1], *next, positions, within);
            return std::vector<Tensor>{r.sum, r.normed};
          },
          {x, normed});
      x = out[0];
      normed = out[1];
    } else {
      ResidualNorm r = layer->forward(x, normed, *next, positions, within);
      x = r.sum;
      normed = r.normed;
    }
  }
  return normed;
}

Loss Llama::loss(const Tensor& idx, const Tensor& targets, const BatchLayout& layout) const {
  ACCRUE_CHECK(targets.defined() && idx.defined() && targets.shape() == idx.shape() &&
                   targets.device() == idx.device(),
               "Llama::loss: targets (", describe(targets), ") must match idx (", describe(idx),
               ")");
  const Tensor hidden = forward(idx, layout);
  accrue::await_parameters({head_weight_});  // Note [Close under the forward]
  return classifier_cross_entropy(hidden, head_weight_, targets, config_.vocab_size,
                                  /*ignore_index=*/-100);
}

Tensor Llama::logits(const Tensor& idx, const BatchLayout& layout) const {
  const Tensor hidden = forward(idx, layout);
  accrue::await_parameters({head_weight_});  // Note [Close under the forward]
  return matmul(hidden, transpose(head_weight_, 0, 1));
}

}  // namespace accrue::nn
