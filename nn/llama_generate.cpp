#include "accrue/nn/llama_generate.h"

#include <algorithm>
#include <string>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"

namespace accrue::nn {

namespace {

// The kernels' rotary scaling from the config's, as Llama's attention makes
// it (Note [Rotary embedding]).
accrue::RopeScaling kernel_scaling(const nn::RopeScaling& r) {
  if (r.type == nn::RopeScaling::Type::none) return {};
  return accrue::RopeScaling::llama3(r.factor, r.low_freq_factor, r.high_freq_factor,
                                     r.original_max_position_embeddings);
}

int64_t argmax_id(const Tensor& logits) {
  return argmax(logits, 0).to(Device::cpu()).to_vector<int64_t>().at(0);
}

}  // namespace

LlamaKVCache::LlamaKVCache(const Llama& model, int64_t batch, int64_t max_len)
    : model_(model), batch_(batch), max_len_(max_len) {
  const LlamaConfig& c = model.config();
  ACCRUE_CHECK(batch >= 1, "LlamaKVCache: batch ", batch, " must be >= 1");
  ACCRUE_CHECK(max_len >= 1 && max_len <= c.max_positions, "LlamaKVCache: max_len ", max_len,
               " must be in [1, max_position_embeddings = ", c.max_positions, "]");
  const DType dtype = model.embed_tokens().dtype();
  for (int64_t i = 0; i < model.num_layers(); ++i) {
    keys_.push_back(zeros({batch, c.kv_heads, max_len, c.head_dim}, dtype, model.device()));
    values_.push_back(zeros({batch, c.kv_heads, max_len, c.head_dim}, dtype, model.device()));
  }
}

const Tensor& LlamaKVCache::keys(int64_t layer) const {
  ACCRUE_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()),
               "LlamaKVCache::keys: layer ", layer, " of ", keys_.size());
  return keys_[static_cast<size_t>(layer)];
}

const Tensor& LlamaKVCache::values(int64_t layer) const {
  ACCRUE_CHECK(layer >= 0 && layer < static_cast<int64_t>(values_.size()),
               "LlamaKVCache::values: layer ", layer, " of ", values_.size());
  return values_[static_cast<size_t>(layer)];
}

Tensor LlamaKVCache::attention(int64_t i, const Tensor& x, const Tensor& positions, int64_t T) {
  // See Note [Llama KV cache]: LlamaAttention::forward's ops, its keys and
  // values written into the cache and read back with the past.
  const LlamaConfig& c = model_.config();
  const LlamaAttention& a = model_.layer(i).self_attn();
  const int64_t B = batch_, D = c.head_dim, H = c.heads, G = c.kv_heads;
  const accrue::RopeScaling scaling = kernel_scaling(c.rope_scaling);
  auto heads = [&](const Linear& proj, int64_t n, const RMSNorm* norm, bool rotate) {
    Tensor h = reshape(proj.forward(x), {B, T, n, D});
    if (norm != nullptr) h = qk_norm(h, norm->weight(), norm->eps());
    if (rotate) h = rope(h, positions, c.rope_theta, RopeStyle::RotateHalf, scaling);
    return transpose(h, 1, 2);  // [B, n, T, D]
  };
  const Tensor q = heads(a.q_proj(), H, a.q_norm(), true);
  const Tensor& kc = keys_[static_cast<size_t>(i)];
  const Tensor& vc = values_[static_cast<size_t>(i)];
  kc.narrow(2, length_, T).copy_(heads(a.k_proj(), G, a.k_norm(), true));
  vc.narrow(2, length_, T).copy_(heads(a.v_proj(), G, nullptr, false));
  const int64_t L = length_ + T;
  const Tensor out = scaled_dot_product_attention(
      q, kc.narrow(2, 0, L), vc.narrow(2, 0, L), SdpaOptions().causal(MaskAlignment::bottom_right));
  return a.o_proj().forward(reshape(transpose(out, 1, 2), {B, T, H * D}));
}

Tensor LlamaKVCache::forward(const Tensor& idx) {
  NoGradGuard no_grad;
  ACCRUE_CHECK(idx.defined() && idx.dim() == 2 && idx.size(0) == batch_ && idx.size(1) >= 1,
               "LlamaKVCache::forward: idx must be [B = ", batch_, ", T >= 1], got ",
               idx.defined() ? shape_str(idx.shape()) : std::string("an undefined tensor"));
  ACCRUE_CHECK(idx.dtype() == DType::i32 || idx.dtype() == DType::i64,
               "LlamaKVCache::forward: idx must hold i32 or i64 token ids, got ",
               dtype_name(idx.dtype()));
  ACCRUE_CHECK(idx.device() == model_.device(), "LlamaKVCache::forward: idx on ",
               idx.device().str(), ", model on ", model_.device().str());
  const int64_t T = idx.size(1);
  ACCRUE_CHECK(length_ + T <= max_len_, "LlamaKVCache::forward: ", T, " tokens after the ", length_,
               " cached exceed max_len = ", max_len_);
  const Tensor positions = arange(static_cast<double>(length_), static_cast<double>(length_ + T),
                                  1.0, DType::i64, model_.device());
  // Note [Llama residual stream]: (x, input_layernorm(x)) go from layer to layer.
  Tensor x = embedding(model_.embed_tokens(), idx);
  Tensor normed = model_.layer(0).input_layernorm().forward(x);
  for (int64_t i = 0; i < model_.num_layers(); ++i) {
    const LlamaDecoderLayer& layer = model_.layer(i);
    const RMSNorm& next =
        i + 1 < model_.num_layers() ? model_.layer(i + 1).input_layernorm() : model_.norm();
    const RMSNorm& post = layer.post_attention_layernorm();
    const ResidualNorm h =
        add_rms_norm(attention(i, normed, positions, T), x, post.weight(), post.eps());
    const ResidualNorm r =
        add_rms_norm(layer.mlp().forward(h.normed), h.sum, next.weight(), next.eps());
    x = r.sum;
    normed = r.normed;
  }
  length_ += T;
  return matmul(normed, transpose(model_.head_weight(), 0, 1));
}

std::vector<int64_t> generate_greedy(const Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t new_tokens, bool use_cache,
                                     std::vector<Tensor>* step_logits,
                                     const std::vector<int64_t>& stop_ids) {
  // See Note [Greedy generation].
  NoGradGuard no_grad;
  const LlamaConfig& c = model.config();
  ACCRUE_CHECK(!prompt.empty(), "generate_greedy: the prompt is empty");
  ACCRUE_CHECK(new_tokens >= 1, "generate_greedy: new_tokens = ", new_tokens, " must be >= 1");
  for (size_t t = 0; t < prompt.size(); ++t)
    ACCRUE_CHECK(prompt[t] >= 0 && prompt[t] < c.vocab_size, "generate_greedy: prompt token ", t,
                 " = ", prompt[t], " is outside the vocabulary [0, ", c.vocab_size, ")");
  for (size_t t = 0; t < stop_ids.size(); ++t)
    ACCRUE_CHECK(stop_ids[t] >= 0 && stop_ids[t] < c.vocab_size, "generate_greedy: stop id ", t,
                 " = ", stop_ids[t], " is outside the vocabulary [0, ", c.vocab_size, ")");
  const int64_t P = static_cast<int64_t>(prompt.size());
  ACCRUE_CHECK(new_tokens <= c.max_positions && P <= c.max_positions - new_tokens + 1,
               "generate_greedy: a prompt of ", P, " tokens and ", new_tokens, " new tokens feed ",
               P, " + ", new_tokens,
               " - 1 positions, more than max_position_embeddings = ", c.max_positions);
  const Device device = model.device();
  std::vector<int64_t> seq = prompt, out;
  // Returns whether to go on.
  auto take = [&](const Tensor& logits) {  // logits [vocab]
    if (step_logits != nullptr) step_logits->push_back(logits);
    const int64_t id = argmax_id(logits);
    out.push_back(id);
    seq.push_back(id);
    return std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end();
  };
  if (use_cache) {
    LlamaKVCache cache(model, 1, P + new_tokens - 1);
    Tensor logits = cache.forward(from_vector<int64_t>(prompt, {1, P}, DType::i64, device));
    bool go_on = take(logits.select(0, 0).select(0, P - 1));
    for (int64_t n = 1; n < new_tokens && go_on; ++n) {
      logits = cache.forward(from_vector<int64_t>({seq.back()}, {1, 1}, DType::i64, device));
      go_on = take(logits.select(0, 0).select(0, 0));
    }
  } else {
    for (int64_t n = 0; n < new_tokens; ++n) {
      const int64_t T = static_cast<int64_t>(seq.size());
      const Tensor logits = model.logits(from_vector<int64_t>(seq, {1, T}, DType::i64, device));
      if (!take(logits.select(0, 0).select(0, T - 1))) break;
    }
  }
  return out;
}

}  // namespace accrue::nn
