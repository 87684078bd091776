// Hugging Face LlamaForCausalLM / Qwen3ForCausalLM checkpoints: the tensor
// names and shapes a config implies, the checks a loaded directory must pass,
// and a directory (config.json + safetensors, single or sharded) read and
// written. The model (nn::Llama) maps these names onto its parameters.
//
// Names, per layer i (transformers' state_dict order):
//   model.embed_tokens.weight                      [vocab, hidden]
//   model.layers.{i}.self_attn.q_proj.weight       [heads * head_dim, hidden]
//   model.layers.{i}.self_attn.k_proj.weight       [kv_heads * head_dim, hidden]
//   model.layers.{i}.self_attn.v_proj.weight       [kv_heads * head_dim, hidden]
//   model.layers.{i}.self_attn.o_proj.weight       [hidden, heads * head_dim]
//     (each followed by its .bias when attention_bias)
//   model.layers.{i}.self_attn.q_norm.weight       [head_dim]   (qk_norm)
//   model.layers.{i}.self_attn.k_norm.weight       [head_dim]   (qk_norm)
//   model.layers.{i}.mlp.gate_proj.weight          [intermediate, hidden]
//   model.layers.{i}.mlp.up_proj.weight            [intermediate, hidden]
//   model.layers.{i}.mlp.down_proj.weight          [hidden, intermediate]
//   model.layers.{i}.input_layernorm.weight        [hidden]
//   model.layers.{i}.post_attention_layernorm.weight [hidden]
//   model.norm.weight                              [hidden]
//   lm_head.weight                                 [vocab, hidden] (untied only)
// Weights are [out, in] as nn.Linear's: no transposes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "accrue/core/tensor.h"
#include "accrue/nn/hf_checkpoint.h"
#include "accrue/nn/llama_config.h"

namespace accrue::nn {

struct HFLlamaTensor {
  std::string name;  // "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
};

// Every tensor a checkpoint of `config` holds, in transformers' order (the
// order save_hf_llama_checkpoint shards in). Validates the config.
std::vector<HFLlamaTensor> hf_llama_tensors(const LlamaConfig& config);

// Whether `name` is a buffer older checkpoints carry and loading ignores:
// model.layers.{i}.self_attn.rotary_emb.inv_freq.
bool is_hf_llama_buffer(const std::string& name);

// Refuses, naming the tensor, its file (from `sources`, as
// load_safetensors_dir records them) and both shapes: a missing tensor, an
// unexpected one, a misshapen one, a non-floating dtype, a layer count other
// than config.layers, and, for a tied config, an lm_head.weight that is not
// an exact copy of model.embed_tokens.weight (a tied model has no other
// output layer; a copy is what some writers store, and loading ignores it).
void check_hf_llama_tensors(const LlamaConfig& config, const std::map<std::string, Tensor>& tensors,
                            const std::map<std::string, std::string>* sources = nullptr);

struct HFLlamaCheckpoint {
  LlamaConfig config;
  std::map<std::string, Tensor> tensors;       // by HF name, on the CPU, in the file's dtypes
  std::map<std::string, std::string> sources;  // tensor -> the file it came from
};

// dir/config.json read (read_hf_config), the weights loaded
// (load_safetensors_dir) and checked (check_hf_llama_tensors). Errors name
// the directory and the file.
HFLlamaCheckpoint load_hf_llama_checkpoint(const std::string& dir);

// The reverse: checks `tensors` against `config` (lm_head.weight left out
// when tied), writes dir/config.json and the weights, sharded by
// max_shard_bytes in transformers' order (save_safetensors_dir), so that
// transformers' from_pretrained loads the directory.
void save_hf_llama_checkpoint(const std::string& dir, const LlamaConfig& config,
                              const std::map<std::string, Tensor>& tensors,
                              int64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace accrue::nn
