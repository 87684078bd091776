#include "accrue/nn/gpt2_hf.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/json.h"
#include "accrue/core/tensor_io.h"
#include "accrue/nn/hf_checkpoint.h"

namespace accrue::nn {

namespace {

constexpr const char* kPrefix = "transformer.";

std::string without_prefix(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
}

// The layer index of "h.{i}.<rest>" (prefix already stripped), if it is one.
std::optional<int64_t> layer_of(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return std::nullopt;
  size_t end = 2;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])))
    ++end;
  if (end == 2 || end >= name.size() || name[end] != '.' || end - 2 > 9) return std::nullopt;
  return std::stoll(name.substr(2, end - 2));
}

// A copy on the CPU that shares nothing with `t`.
Tensor host_copy(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor d = detach(t);
  return d.device().is_cpu() ? d.clone() : d.to(Device::cpu());
}

bool same_values(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.to(a.dtype()).contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

std::vector<HFTensor> hf_gpt2_tensors(const GPT2Config& config) {
  config.validate();
  const int64_t C = config.n_embd, V = config.vocab_size, S = config.block_size;
  std::vector<HFTensor> out;
  auto add = [&](const std::string& param, Shape shape, bool transposed = false) {
    HFTensor t;
    t.param_name = param;
    t.hf_name = kPrefix + param;
    t.param_shape = shape;
    t.hf_shape = transposed ? Shape{shape[1], shape[0]} : shape;
    t.transposed = transposed;
    out.push_back(std::move(t));
  };
  add("wte", {config.padded_vocab(), C});
  out.back().hf_name = "transformer.wte.weight";
  out.back().hf_shape = {V, C};
  add("wpe", {S, C});
  out.back().hf_name = "transformer.wpe.weight";
  auto layer_norm = [&](const std::string& name) {
    add(name + ".weight", {C});
    if (config.bias) add(name + ".bias", {C});
  };
  auto conv1d = [&](const std::string& name, int64_t in, int64_t out_features) {
    add(name + ".weight", {out_features, in}, /*transposed=*/true);
    if (config.bias) add(name + ".bias", {out_features});
  };
  for (int64_t i = 0; i < config.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    layer_norm(h + "ln_1");
    conv1d(h + "attn.c_attn", C, 3 * C);
    conv1d(h + "attn.c_proj", C, C);
    layer_norm(h + "ln_2");
    conv1d(h + "mlp.c_fc", C, 4 * C);
    conv1d(h + "mlp.c_proj", 4 * C, C);
  }
  layer_norm("ln_f");
  return out;
}

bool is_hf_gpt2_buffer(const std::string& name) {
  const std::string n = without_prefix(name);
  if (!layer_of(n)) return false;
  const std::string rest = n.substr(n.find('.', 2) + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

std::map<std::string, Tensor> params_from_hf_gpt2(const GPT2Config& config,
                                                  const std::map<std::string, Tensor>& hf) {
  const std::vector<HFTensor> specs = hf_gpt2_tensors(config);
  // File names by their unprefixed form, so both naming schemes load.
  std::map<std::string, std::string> by_short;
  int64_t file_layers = 0;
  for (const auto& [name, tensor] : hf) {
    const std::string s = without_prefix(name);
    auto [it, inserted] = by_short.emplace(s, name);
    ACCRUE_CHECK(inserted, "GPT-2 checkpoint: both '", it->second, "' and '", name,
                 "' name the same tensor");
    if (std::optional<int64_t> layer = layer_of(s)) file_layers = std::max(file_layers, *layer + 1);
  }
  ACCRUE_CHECK(file_layers == config.n_layer, "GPT-2 checkpoint: the file has ", file_layers,
               " layers (transformer.h.{i}), the model n_layer ", config.n_layer);

  std::map<std::string, Tensor> params;
  std::map<std::string, bool> used;
  NoGradGuard no_grad;
  for (const HFTensor& spec : specs) {
    auto it = by_short.find(without_prefix(spec.hf_name));
    ACCRUE_CHECK(it != by_short.end(), "GPT-2 checkpoint: missing tensor '", spec.hf_name,
                 "' of shape ", shape_str(spec.hf_shape));
    const Tensor& t = hf.at(it->second);
    ACCRUE_CHECK(t.shape() == spec.hf_shape, "GPT-2 checkpoint: tensor '", it->second,
                 "' has shape ", shape_str(t.shape()), ", expected ", shape_str(spec.hf_shape),
                 spec.transposed ? " (Conv1D layout [in, out])" : "");
    ACCRUE_CHECK(is_floating(t.dtype()), "GPT-2 checkpoint: tensor '", it->second, "' has dtype ",
                 dtype_name(t.dtype()), "; expected a floating dtype");
    used[it->first] = true;
    Tensor p;
    if (spec.transposed) {
      p = t.transpose(0, 1).contiguous();
    } else if (spec.param_name == "wte") {
      p = zeros(spec.param_shape, t.dtype());
      p.narrow(0, 0, config.vocab_size).copy_(t);
    } else {
      p = t.contiguous();
    }
    params.emplace(spec.param_name, p);
  }
  // lm_head is tied to wte: a copy of it is fine, anything else is another model.
  if (auto it = by_short.find("lm_head.weight"); it != by_short.end()) {
    const Tensor& lm = hf.at(it->second);
    const Tensor& wte = hf.at(by_short.at("wte.weight"));
    ACCRUE_CHECK(lm.shape() == wte.shape() && same_values(wte, lm), "GPT-2 checkpoint: '",
                 it->second, "' of shape ", shape_str(lm.shape()),
                 " differs from the token embedding (of shape ", shape_str(wte.shape()),
                 "): accrue's GPT2 ties the output layer to wte");
    used[it->first] = true;
  }
  for (const auto& [name, original] : by_short) {
    ACCRUE_CHECK(used.count(name) || is_hf_gpt2_buffer(name),
                 "GPT-2 checkpoint: unexpected tensor '", original, "' of shape ",
                 shape_str(hf.at(original).shape()));
  }
  return params;
}

std::map<std::string, Tensor> params_to_hf_gpt2(const GPT2Config& config,
                                                const std::vector<NamedParameter>& params) {
  std::map<std::string, Tensor> by_name;
  for (const NamedParameter& p : params)
    by_name.emplace(p.name, p.tensor);
  std::map<std::string, Tensor> hf;
  NoGradGuard no_grad;
  for (const HFTensor& spec : hf_gpt2_tensors(config)) {
    auto it = by_name.find(spec.param_name);
    ACCRUE_CHECK(it != by_name.end(), "save GPT-2: the model has no parameter '", spec.param_name,
                 "'");
    ACCRUE_CHECK(it->second.shape() == spec.param_shape, "save GPT-2: parameter '", spec.param_name,
                 "' has shape ", shape_str(it->second.shape()), ", expected ",
                 shape_str(spec.param_shape));
    Tensor t = host_copy(it->second);
    if (spec.transposed) t = t.transpose(0, 1).contiguous();
    if (spec.param_name == "wte") t = t.narrow(0, 0, config.vocab_size).contiguous();
    hf.emplace(spec.hf_name, t);
  }
  ACCRUE_CHECK(by_name.size() == hf.size(), "save GPT-2: the model has ", by_name.size(),
               " parameters, an HF GPT-2 of this config ", hf.size());
  return hf;
}

void load_hf_gpt2(GPT2& model, const std::string& safetensors_path) {
  std::map<std::string, Tensor> params;
  try {
    params = params_from_hf_gpt2(model.config(), load_safetensors(safetensors_path));
  } catch (const Error& e) {
    ACCRUE_FAIL("load_hf_gpt2(", safetensors_path, "): ", e.message());
  }
  for (const NamedParameter& p : model.named_parameters()) {
    auto it = params.find(p.name);
    ACCRUE_CHECK(it != params.end(), "load_hf_gpt2: the file maps to no parameter '", p.name, "'");
    load_parameter(p.tensor, it->second);  // Note [One load path]
  }
}

void save_hf_gpt2(const GPT2& model, const std::string& path) {
  // "format": "pt" is what transformers expects of a PyTorch checkpoint's metadata.
  // The master weights where a store holds them (Note [One load path]), not the compute copy.
  std::vector<NamedParameter> params = model.named_parameters();
  for (NamedParameter& p : params)
    p.tensor = parameter_value(p.tensor);
  save_safetensors(path, params_to_hf_gpt2(model.config(), params), {{"format", "pt"}});
}

GPT2Config parse_hf_gpt2_config(const std::string& text, const std::string& name) {
  const detail::FileRef file{"read_hf_gpt2_config", name};
  ACCRUE_CHECK(hf_model_type(text, name) == "gpt2", file, ": model_type '",
               hf_model_type(text, name), "' is not a GPT-2 config (expected 'gpt2')");
  detail::JsonReader json(text, file, "config JSON");
  std::optional<int64_t> layers, heads, embd, vocab, positions, ctx, inner;
  std::optional<double> eps;
  std::set<std::string> seen;
  // A boolean key that must hold `required` when present.
  const auto require_bool = [&](const std::string& key, bool required, const char* why) {
    const bool v = json.parse_bool("'" + key + "'");
    if (v != required)
      json.fail("'", key, "' is ", v ? "true" : "false", ": ", why, " is not supported");
  };
  json.parse_object("the config", [&](const std::string& key) {
    if (!seen.insert(key).second) json.fail("duplicate key '", key, "'");
    const std::string what = "'" + key + "'";
    if (key == "n_layer") {
      layers = json.parse_integer(what);
    } else if (key == "n_head") {
      heads = json.parse_integer(what);
    } else if (key == "n_embd") {
      embd = json.parse_integer(what);
    } else if (key == "vocab_size") {
      vocab = json.parse_integer(what);
    } else if (key == "n_positions") {
      positions = json.parse_integer(what);
    } else if (key == "n_ctx") {
      ctx = json.parse_integer(what);
    } else if (key == "n_inner") {
      if (!json.consume_null()) inner = json.parse_integer(what);
    } else if (key == "layer_norm_epsilon") {
      eps = json.parse_number(what);
    } else if (key == "activation_function") {
      if (json.peek() != '"') json.fail(what, " must be a string, found ", json.describe_next());
      const std::string act = json.parse_string();
      if (act != "gelu_new" && act != "gelu_pytorch_tanh")
        json.fail(what, " is '", act,
                  "': accrue's GPT-2 computes the tanh GELU ('gelu_new', 'gelu_pytorch_tanh')");
    } else if (key == "scale_attn_weights") {
      require_bool(key, true, "attention without the 1/sqrt(head size) scale");
    } else if (key == "scale_attn_by_inverse_layer_idx") {
      require_bool(key, false, "attention scaled by the layer index");
    } else if (key == "add_cross_attention") {
      require_bool(key, false, "cross-attention");
    } else if (key == "tie_word_embeddings") {
      require_bool(key, true, "an output layer apart from wte");
    } else if (key == "quantization_config") {
      json.fail(what, " is present: quantized checkpoints are not supported");
    } else {
      json.skip_value();  // model_type (checked), dropouts, architectures, ...
    }
  });
  json.expect_end();
  const std::pair<const char*, const std::optional<int64_t>*> required[] = {
      {"n_layer", &layers}, {"n_head", &heads}, {"n_embd", &embd}, {"vocab_size", &vocab}};
  for (const auto& [key, value] : required)
    ACCRUE_CHECK(value->has_value(), file, ": the config has no '", key, "'");
  ACCRUE_CHECK(positions || ctx, file, ": the config has neither 'n_positions' nor 'n_ctx'");
  ACCRUE_CHECK(!positions || !ctx || *positions == *ctx, file, ": 'n_positions' ",
               positions.value_or(0), " and 'n_ctx' ", ctx.value_or(0), " differ");
  GPT2Config c;
  c.n_layer = *layers;
  c.n_head = *heads;
  c.n_embd = *embd;
  c.vocab_size = *vocab;
  c.block_size = positions ? *positions : *ctx;
  c.layer_norm_eps = eps.value_or(1e-5);
  c.padded_vocab_size = 0;
  ACCRUE_CHECK(!inner || *inner == 4 * c.n_embd, file, ": 'n_inner' ", inner.value_or(0),
               " is not 4 * n_embd = ", 4 * c.n_embd, ", the only MLP width accrue's GPT-2 has");
  return validated_hf_config(std::move(c), file);
}

GPT2Config read_hf_gpt2_config(const std::string& path) {
  return parse_hf_gpt2_config(read_hf_config_text(path, "read_hf_gpt2_config"), path);
}

std::unique_ptr<GPT2> gpt2_from_hf(const std::string& dir, const ParamOptions& options,
                                   bool activation_checkpointing) {
  const std::filesystem::path d(dir);
  GPT2Config c = read_hf_gpt2_config((d / "config.json").string());
  c.activation_checkpointing = activation_checkpointing;
  auto model = std::make_unique<GPT2>(c, options);
  load_hf_gpt2(*model, (d / "model.safetensors").string());
  return model;
}

}  // namespace accrue::nn
