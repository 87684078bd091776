// Greedy generation from an nn::Llama, with a KV cache, so that a user can
// sanity-check a loaded checkpoint against transformers'
// generate(do_sample=False).
//
//   auto model = nn::Llama::from_hf("dir", {Device::cpu(), DType::f32});
//   std::vector<int64_t> out = nn::generate_greedy(*model, {1, 2, 3}, 8);
#pragma once

#include <cstdint>
#include <vector>

#include "accrue/core/tensor.h"
#include "accrue/nn/llama.h"

namespace accrue::nn {

// Note [Llama KV cache]
// ~~~~~~~~~~~~~~~~~~~~~
// Each layer keeps the rotated keys and the values of every token seen so
// far in [B, kv_heads, max_len, head_dim] tensors of the parameters' dtype on
// the model's device (grouped-query heads stay unexpanded). forward(idx)
// runs tokens [length, length + T) through the layers as Llama::forward does
// (the same ops in the same order: embedding, the fused residual norms of
// Note [Llama residual stream], QK-norm, rope at positions length ..
// length + T - 1), writes their keys and values into the cache, and lets the
// T queries attend to the first length + T cached keys under a causal mask
// aligned bottom-right (query t sees keys 0 .. length + t). A prefill (length
// 0) is therefore the plain causal forward, and a step of one token sees the
// whole past; the logits equal those of rerunning the whole sequence (the
// test checks 1e-12 in f64). Everything runs under NoGradGuard: the cache is
// for inference only.
class LlamaKVCache {
 public:
  // Room for max_len tokens (at most the model's max_positions) of `batch` rows.
  LlamaKVCache(const Llama& model, int64_t batch, int64_t max_len);

  // idx [B, T] i32/i64 token ids on the model's device -> logits [B, T,
  // vocab] in the parameters' dtype; appends the T tokens to the cache.
  Tensor forward(const Tensor& idx);

  // Forgets every cached token (the memory stays).
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }
  int64_t batch() const { return batch_; }
  // Layer i's keys and values, [B, kv_heads, max_len, head_dim]; the first
  // length() positions hold data.
  const Tensor& keys(int64_t layer) const;
  const Tensor& values(int64_t layer) const;

 private:
  Tensor attention(int64_t layer, const Tensor& normed, const Tensor& positions, int64_t T);

  const Llama& model_;
  int64_t batch_, max_len_, length_ = 0;
  std::vector<Tensor> keys_, values_;
};

// Note [Greedy generation]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Generates up to new_tokens tokens after `prompt`, each the argmax of the
// last position's logits (the lowest id among equal maxima, as torch.argmax).
// It stops early only after emitting an id of stop_ids (kept in the output,
// as transformers keeps its eos), so with stop_ids empty it is transformers'
// generate(do_sample=False, max_new_tokens=N) with eos_token_id unset, and
// with stop_ids the model's eos ids it is the same with them set. With
// use_cache the prompt is prefilled once and each step feeds one token (Note
// [Llama KV cache]); without, every step reruns Llama::logits over the whole
// sequence, the reference the cache is checked against. The prompt must be
// non-empty, its ids and stop_ids in [0, vocab_size), new_tokens >= 1, and
// prompt + new_tokens - 1 tokens (the last one is never fed) must fit
// max_position_embeddings; otherwise accrue::Error names the value.
// step_logits, when given, receives each step's logits [vocab] (the
// parameters' dtype, on the model's device).
std::vector<int64_t> generate_greedy(const Llama& model, const std::vector<int64_t>& prompt,
                                     int64_t new_tokens, bool use_cache = true,
                                     std::vector<Tensor>* step_logits = nullptr,
                                     const std::vector<int64_t>& stop_ids = {});

}  // namespace accrue::nn
