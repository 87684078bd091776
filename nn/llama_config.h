// The configuration of a Llama-style decoder (Llama 2, 3, 3.1, 3.2 and Qwen3):
// RMSNorm, rotary embeddings (optionally with Llama 3's frequency scaling),
// grouped-query attention, SwiGLU, optional per-head QK-norm (Qwen3), tied or
// untied output layer. Presets by name, and Hugging Face config.json files
// read and written (transformers' LlamaConfig / Qwen3Config).
//
//   nn::LlamaConfig c = nn::LlamaConfig::from_name("llama3.2-1b");
//   nn::LlamaConfig d = nn::read_hf_config("Llama-3.2-1B/config.json");
//   nn::write_hf_config(d, "out/config.json");
//
// This file depends on core alone, so the config reader can be fuzzed
// without the rest of the library (fuzz/fuzz_hf_config.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accrue::nn {

// Rotary frequencies: plain (inv_freq = theta^(-2i/head_dim)), or Llama 3's
// scaling (transformers' "llama3" rope type): wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by factor,
// those shorter than original_max_position_embeddings / high_freq_factor kept,
// and the band between interpolated smoothly.
struct RopeScaling {
  enum class Type { none, llama3 };
  Type type = Type::none;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  bool operator==(const RopeScaling&) const = default;
};

struct LlamaConfig {
  // "llama" or "qwen3": what config.json says, and how write_hf_config names it.
  std::string model_type = "llama";
  int64_t vocab_size = 32000;
  int64_t hidden = 768;         // hidden_size
  int64_t intermediate = 2048;  // intermediate_size: the SwiGLU width
  int64_t layers = 12;          // num_hidden_layers
  int64_t heads = 12;           // num_attention_heads
  int64_t kv_heads = 4;         // num_key_value_heads: heads % kv_heads == 0
  // The width of one head, independent of hidden / heads (Qwen3-0.6B: 16
  // heads of 128 over a hidden size of 1024). q_proj is [heads * head_dim,
  // hidden], k_proj and v_proj [kv_heads * head_dim, hidden].
  int64_t head_dim = 64;
  int64_t max_positions = 2048;  // max_position_embeddings: the rotary table's rows
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_eps = 1e-5;  // rms_norm_eps
  // The output layer is the token embedding (lm_head.weight absent from files).
  bool tie_word_embeddings = false;
  // Qwen3: an RMSNorm of head_dim over each query and key head, before RoPE
  // (self_attn.q_norm.weight, self_attn.k_norm.weight).
  bool qk_norm = false;
  // Biases on q_proj, k_proj, v_proj and o_proj, as transformers' Llama and
  // Qwen3 add them when attention_bias is true (false in every released
  // Llama and Qwen3 checkpoint).
  bool attention_bias = false;
  // The standard deviation of the normal initialization of every weight
  // matrix and the embedding (transformers' initializer_range).
  double initializer_range = 0.02;
  // Token ids from config.json, for data and generation; -1 / empty: none.
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // Not part of config.json: each block's forward runs inside
  // checkpoint_multi (Note [Activation checkpointing]).
  bool activation_checkpointing = false;

  // llama-125m: 12 layers, hidden 768, 12 heads / 4 kv heads of 64, SwiGLU
  // 2048, vocabulary 32000, untied, theta 10000, 2048 positions (124.7M).
  static LlamaConfig llama_125m();
  // Llama 3.2 1B: 16 layers, hidden 2048, 32 / 8 heads of 64, SwiGLU 8192,
  // vocabulary 128256, tied, theta 500000 with llama3 scaling (factor 32,
  // low 1, high 4, original 8192), 131072 positions, eps 1e-5 (1.24B).
  static LlamaConfig llama3_2_1b();
  // Qwen3 0.6B: 28 layers, hidden 1024, 16 / 8 heads of 128, SwiGLU 3072,
  // vocabulary 151936, tied, QK-norm, theta 1e6, 40960 positions, eps 1e-6 (0.6B).
  static LlamaConfig qwen3_0_6b();
  // For tests: 2 layers, hidden 64, 4 / 2 heads of 16, SwiGLU 128,
  // vocabulary 256, 128 positions (llama-tiny untied; qwen3-tiny tied with
  // QK-norm and heads of 32, apart from hidden / heads).
  static LlamaConfig llama_tiny();
  static LlamaConfig qwen3_tiny();
  // "llama-125m", "llama3.2-1b", "qwen3-0.6b", "llama-tiny", "qwen3-tiny".
  static LlamaConfig from_name(const std::string& name);
  static std::vector<std::string> preset_names();

  // Throws accrue::Error naming the field and its value.
  void validate() const;
  // The parameters the model has (transformers' count), without building it.
  int64_t parameter_count() const;

  bool operator==(const LlamaConfig&) const = default;
};

// Reads a Hugging Face config.json of model_type "llama" or "qwen3" (any
// other model_type is refused, naming it). Both rope layouts are read: the
// rope_theta + rope_scaling of transformers 4 and the Hub's files, and the
// rope_parameters of transformers 5 (where both are present they must agree).
// Keys the config does not use are skipped; settings accrue cannot honour are
// refused naming the key and the value: hidden_act other than silu, mlp_bias,
// a rope type other than default and llama3, sliding-window attention (Qwen3's
// use_sliding_window, layer_types other than full_attention). head_dim
// defaults to hidden_size / num_attention_heads and num_key_value_heads to
// num_attention_heads, as in transformers. The result is validated. Errors
// name the file, the key and the value (Note [Untrusted tensor files]).
LlamaConfig read_hf_config(const std::string& path);
// The same from the text of a config.json; `name` stands for the file in errors.
LlamaConfig parse_hf_config(const std::string& text, const std::string& name);

// Writes a config.json transformers loads as LlamaForCausalLM or
// Qwen3ForCausalLM (rope_theta and rope_scaling as transformers 4 writes
// them, which transformers 5 reads too), crash-safe (Note [Crash-safe
// saves]). A qk_norm config must have model_type "qwen3" and a "qwen3" one
// qk_norm: transformers' classes have no other combination.
void write_hf_config(const LlamaConfig& config, const std::string& path);
std::string hf_config_json(const LlamaConfig& config);

}  // namespace accrue::nn
