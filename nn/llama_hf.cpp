#include "accrue/nn/llama_hf.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"

namespace accrue::nn {

namespace {

constexpr const char* kLayerPrefix = "model.layers.";
constexpr const char* kEmbedding = "model.embed_tokens.weight";
constexpr const char* kHead = "lm_head.weight";

// The layer index of "model.layers.{i}.<rest>", if `name` is one.
std::optional<int64_t> layer_of(const std::string& name) {
  const size_t start = std::strlen(kLayerPrefix);
  if (name.rfind(kLayerPrefix, 0) != 0) return std::nullopt;
  size_t end = start;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])))
    ++end;
  if (end == start || end >= name.size() || name[end] != '.' || end - start > 9)
    return std::nullopt;
  return std::stoll(name.substr(start, end - start));
}

std::string kind(const LlamaConfig& c) {
  return c.model_type == "qwen3" ? "Qwen3 checkpoint" : "Llama checkpoint";
}

// " (in 'file')" when the tensor's file is known.
std::string in_file(const std::map<std::string, std::string>* sources, const std::string& name) {
  if (!sources) return "";
  auto it = sources->find(name);
  return it == sources->end() ? "" : " (in '" + it->second + "')";
}

// Bitwise equal, on any device (a model's parameters may be on a GPU).
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  NoGradGuard no_grad;  // raw copies of parameters (Note [Raw views])
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

std::vector<HFLlamaTensor> hf_llama_tensors(const LlamaConfig& c) {
  c.validate();
  const int64_t H = c.hidden, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  std::vector<HFLlamaTensor> out;
  const auto add = [&](std::string name, Shape shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  add(kEmbedding, {c.vocab_size, H});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = kLayerPrefix + std::to_string(i) + ".";
    const auto projection = [&](const char* name, int64_t out_features, int64_t in_features) {
      add(p + "self_attn." + name + ".weight", {out_features, in_features});
      if (c.attention_bias) add(p + "self_attn." + name + ".bias", {out_features});
    };
    projection("q_proj", q, H);
    projection("k_proj", kv, H);
    projection("v_proj", kv, H);
    projection("o_proj", H, q);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim});
      add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    add(p + "mlp.gate_proj.weight", {c.intermediate, H});
    add(p + "mlp.up_proj.weight", {c.intermediate, H});
    add(p + "mlp.down_proj.weight", {H, c.intermediate});
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
  }
  add("model.norm.weight", {H});
  if (!c.tie_word_embeddings) add(kHead, {c.vocab_size, H});
  return out;
}

bool is_hf_llama_buffer(const std::string& name) {
  if (!layer_of(name)) return false;
  const std::string rest = name.substr(name.find('.', std::strlen(kLayerPrefix)) + 1);
  return rest == "self_attn.rotary_emb.inv_freq";
}

void check_hf_llama_tensors(const LlamaConfig& config, const std::map<std::string, Tensor>& tensors,
                            const std::map<std::string, std::string>* sources) {
  const std::vector<HFLlamaTensor> specs = hf_llama_tensors(config);
  const std::string what = kind(config);
  int64_t file_layers = 0;
  std::string deepest;
  for (const auto& [name, t] : tensors)
    if (std::optional<int64_t> layer = layer_of(name); layer && *layer + 1 > file_layers) {
      file_layers = *layer + 1;
      deepest = name;
    }
  ACCRUE_CHECK(file_layers <= config.layers, what, ": tensor '", deepest, "'",
               in_file(sources, deepest), " is of layer ", file_layers - 1,
               ", but the config has num_hidden_layers ", config.layers);
  for (const HFLlamaTensor& spec : specs) {
    auto it = tensors.find(spec.name);
    ACCRUE_CHECK(it != tensors.end(), what, ": missing tensor '", spec.name, "' of shape ",
                 shape_str(spec.shape),
                 file_layers < config.layers
                     ? detail::str_cat(" (the checkpoint has ", file_layers,
                                       " layers, the config num_hidden_layers ", config.layers, ")")
                     : std::string());
    ACCRUE_CHECK(it->second.shape() == spec.shape, what, ": tensor '", spec.name, "'",
                 in_file(sources, spec.name), " has shape ", shape_str(it->second.shape()),
                 ", expected ", shape_str(spec.shape), " from the config");
    ACCRUE_CHECK(is_floating(it->second.dtype()), what, ": tensor '", spec.name, "'",
                 in_file(sources, spec.name), " has dtype ", dtype_name(it->second.dtype()),
                 "; expected a floating dtype");
  }
  std::map<std::string, bool> expected;
  for (const HFLlamaTensor& spec : specs)
    expected[spec.name] = true;
  for (const auto& [name, t] : tensors) {
    if (expected.count(name) || is_hf_llama_buffer(name)) continue;
    if (name == kHead && config.tie_word_embeddings) {
      // Tied: a copy of the embedding is harmless, anything else another model.
      const Tensor embedding = tensors.at(kEmbedding);  // a handle: no reference to a temporary key
      ACCRUE_CHECK(same_values(t, embedding), what, ": '", kHead, "'", in_file(sources, name),
                   " of shape ", shape_str(t.shape()), " and dtype ", dtype_name(t.dtype()),
                   " is not a copy of '", kEmbedding, "' (shape ", shape_str(embedding.shape()),
                   "), but the config has tie_word_embeddings true");
      continue;
    }
    ACCRUE_FAIL(what, ": unexpected tensor '", name, "'", in_file(sources, name), " of shape ",
                shape_str(t.shape()),
                name == kHead ? " (the config has tie_word_embeddings true)" : "",
                name.find("q_norm") != std::string::npos || name.find("k_norm") != std::string::npos
                    ? " (QK-norm weights, but the config's model_type is not qwen3)"
                : name.ends_with("_proj.bias") ? " (the config has attention_bias false)"
                                               : "");
  }
}

HFLlamaCheckpoint load_hf_llama_checkpoint(const std::string& dir) {
  HFLlamaCheckpoint ckpt;
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  try {
    ckpt.config = read_hf_config(config_path);
    ckpt.tensors = load_safetensors_dir(dir, &ckpt.sources);
    check_hf_llama_tensors(ckpt.config, ckpt.tensors, &ckpt.sources);
  } catch (const Error& e) {
    ACCRUE_FAIL("load_hf_llama_checkpoint('", dir, "'): ", e.message());
  }
  return ckpt;
}

void save_hf_llama_checkpoint(const std::string& dir, const LlamaConfig& config,
                              const std::map<std::string, Tensor>& tensors,
                              int64_t max_shard_bytes) {
  try {
    check_hf_llama_tensors(config, tensors);
    std::vector<std::pair<std::string, Tensor>> ordered;
    for (const HFLlamaTensor& spec : hf_llama_tensors(config))
      ordered.emplace_back(spec.name, tensors.at(spec.name));
    save_safetensors_dir(dir, ordered, max_shard_bytes);
    write_hf_config(config, (std::filesystem::path(dir) / "config.json").string());
  } catch (const Error& e) {
    ACCRUE_FAIL("save_hf_llama_checkpoint('", dir, "'): ", e.message());
  }
}

}  // namespace accrue::nn
