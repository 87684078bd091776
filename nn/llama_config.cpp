#include "accrue/nn/llama_config.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "accrue/core/error.h"
#include "accrue/core/json.h"
#include "accrue/core/tensor_file.h"
#include "accrue/core/utf8.h"
#include "accrue/nn/hf_checkpoint.h"

namespace accrue::nn {

namespace {

// The parameter count of `c`, or -1 when a product or the sum overflows int64
// (a config from a file or a command line: Note [Checked sizes] in
// core/tensor.cpp). Every size the model derives (a weight's elements, the
// rotary table) is one of these terms or smaller.
int64_t checked_parameter_count(const LlamaConfig& c) {
  bool fits = true;
  const auto mul = [&](int64_t x, int64_t y) {
    int64_t r = 0;
    fits = fits && detail::checked_mul(x, y, &r);
    return r;
  };
  const auto add = [&](std::initializer_list<int64_t> terms) {
    int64_t r = 0;
    for (int64_t t : terms)
      fits = fits && !__builtin_add_overflow(r, t, &r);
    return r;
  };
  const int64_t H = c.hidden, q = mul(c.heads, c.head_dim), kv = mul(c.kv_heads, c.head_dim);
  const int64_t attention = add({mul(H, q), mul(2, mul(H, kv)), mul(q, H)});
  const int64_t bias = c.attention_bias ? add({q, mul(2, kv), H}) : 0;
  const int64_t qk_norm = c.qk_norm ? mul(2, c.head_dim) : 0;
  const int64_t mlp = mul(3, mul(H, c.intermediate));
  const int64_t per_layer = add({attention, bias, qk_norm, mlp, mul(2, H)});
  const int64_t embedding = mul(c.vocab_size, H);
  const int64_t total =
      add({embedding, mul(c.layers, per_layer), H, c.tie_word_embeddings ? int64_t{0} : embedding});
  mul(c.max_positions, c.head_dim);  // the rotary tables
  return fits ? total : -1;
}

LlamaConfig tiny(const char* model_type) {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = 256;
  c.hidden = 64;
  c.intermediate = 128;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.max_positions = 128;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-6;
  return c;
}

}  // namespace

LlamaConfig LlamaConfig::llama_125m() {
  return LlamaConfig();  // the defaults are this preset
}

LlamaConfig LlamaConfig::llama3_2_1b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden = 2048;
  c.intermediate = 8192;
  c.layers = 16;
  c.heads = 32;
  c.kv_heads = 8;
  c.head_dim = 64;
  c.max_positions = 131072;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScaling::Type::llama3, 32.0, 1.0, 4.0, 8192};
  c.rms_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

LlamaConfig LlamaConfig::qwen3_0_6b() {
  LlamaConfig c;
  c.model_type = "qwen3";
  c.vocab_size = 151936;
  c.hidden = 1024;
  c.intermediate = 3072;
  c.layers = 28;
  c.heads = 16;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.max_positions = 40960;
  c.rope_theta = 1000000.0;
  c.rms_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  return c;
}

LlamaConfig LlamaConfig::llama_tiny() {
  return tiny("llama");
}

LlamaConfig LlamaConfig::qwen3_tiny() {
  LlamaConfig c = tiny("qwen3");
  c.head_dim = 32;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

std::vector<std::string> LlamaConfig::preset_names() {
  return {"llama-125m", "llama3.2-1b", "qwen3-0.6b", "llama-tiny", "qwen3-tiny"};
}

LlamaConfig LlamaConfig::from_name(const std::string& name) {
  if (name == "llama-125m") return llama_125m();
  if (name == "llama3.2-1b") return llama3_2_1b();
  if (name == "qwen3-0.6b") return qwen3_0_6b();
  if (name == "llama-tiny") return llama_tiny();
  if (name == "qwen3-tiny") return qwen3_tiny();
  ACCRUE_FAIL("LlamaConfig::from_name: unknown model '", name,
              "'; known: llama-125m, llama3.2-1b, qwen3-0.6b, llama-tiny, qwen3-tiny");
}

void LlamaConfig::validate() const {
  const char* op = "LlamaConfig";
  ACCRUE_CHECK(model_type == "llama" || model_type == "qwen3", op, ": model_type '", model_type,
               "' is neither 'llama' nor 'qwen3'");
  const std::pair<const char*, int64_t> positive[] = {{"vocab_size", vocab_size},
                                                      {"hidden", hidden},
                                                      {"intermediate", intermediate},
                                                      {"layers", layers},
                                                      {"heads", heads},
                                                      {"kv_heads", kv_heads},
                                                      {"head_dim", head_dim},
                                                      {"max_positions", max_positions}};
  for (const auto& [field, value] : positive)
    ACCRUE_CHECK(value >= 1, op, ": ", field, " must be >= 1, got ", value);
  ACCRUE_CHECK(heads % kv_heads == 0, op, ": heads ", heads, " is not a multiple of kv_heads ",
               kv_heads, " (grouped-query attention shares each kv head among heads / kv_heads)");
  ACCRUE_CHECK(head_dim % 2 == 0, op, ": head_dim ", head_dim,
               " must be even (rotary embeddings rotate pairs of features)");
  ACCRUE_CHECK(std::isfinite(rope_theta) && rope_theta > 1.0, op, ": rope_theta ", rope_theta,
               " must be a finite number > 1");
  ACCRUE_CHECK(std::isfinite(rms_eps) && rms_eps > 0.0, op, ": rms_eps ", rms_eps,
               " must be a finite number > 0");
  ACCRUE_CHECK(std::isfinite(initializer_range) && initializer_range >= 0.0, op,
               ": initializer_range ", initializer_range, " must be a finite number >= 0");
  ACCRUE_CHECK(bos_token_id >= -1 && bos_token_id < vocab_size, op, ": bos_token_id ", bos_token_id,
               " is outside the vocabulary [0, ", vocab_size, ") (-1: none)");
  for (int64_t id : eos_token_ids)
    ACCRUE_CHECK(id >= 0 && id < vocab_size, op, ": eos_token_id ", id,
                 " is outside the vocabulary [0, ", vocab_size, ")");
  if (rope_scaling.type == RopeScaling::Type::llama3) {
    const RopeScaling& r = rope_scaling;
    ACCRUE_CHECK(std::isfinite(r.factor) && r.factor >= 1.0, op, ": rope_scaling.factor ", r.factor,
                 " must be a finite number >= 1");
    ACCRUE_CHECK(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0.0, op,
                 ": rope_scaling.low_freq_factor ", r.low_freq_factor,
                 " must be a finite number > 0");
    ACCRUE_CHECK(std::isfinite(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor, op,
                 ": rope_scaling.high_freq_factor ", r.high_freq_factor,
                 " must be finite and above low_freq_factor ", r.low_freq_factor,
                 " (the smoothing divides by their difference)");
    ACCRUE_CHECK(r.original_max_position_embeddings >= 1, op,
                 ": rope_scaling.original_max_position_embeddings must be >= 1, got ",
                 r.original_max_position_embeddings);
  }
  ACCRUE_CHECK(checked_parameter_count(*this) >= 0, op, ": vocab_size ", vocab_size, ", hidden ",
               hidden, ", intermediate ", intermediate, ", layers ", layers, ", heads ", heads,
               ", kv_heads ", kv_heads, ", head_dim ", head_dim, ", max_positions ", max_positions,
               ": the parameter count or a weight's size overflows int64");
}

int64_t LlamaConfig::parameter_count() const {
  validate();
  return checked_parameter_count(*this);
}

// ---------------------------------------------------------------------------
// config.json

namespace {

using detail::FileRef;
using detail::JsonReader;

// What a config.json's rope dictionary (rope_scaling or rope_parameters) says.
struct RopeEntry {
  std::optional<std::string> type;
  std::optional<double> theta, factor, low, high;
  std::optional<int64_t> original;
};

RopeEntry parse_rope(JsonReader& json, const std::string& key) {
  RopeEntry r;
  std::set<std::string> seen;
  json.parse_object("'" + key + "'", [&](const std::string& k) {
    const std::string what = "'" + key + "." + k + "'";
    if (!seen.insert(k).second) json.fail("duplicate key ", what);
    if (k == "rope_type" || k == "type") {  // "type": transformers' older spelling
      if (json.peek() != '"') json.fail(what, " must be a string, found ", json.describe_next());
      std::string t = json.parse_string();
      if (r.type && *r.type != t)
        json.fail("'", key, ".rope_type' '", *r.type, "' and '", key, ".type' '", t, "' differ");
      r.type = std::move(t);
    } else if (k == "rope_theta") {
      r.theta = json.parse_number(what);
    } else if (k == "factor") {
      r.factor = json.parse_number(what);
    } else if (k == "low_freq_factor") {
      r.low = json.parse_number(what);
    } else if (k == "high_freq_factor") {
      r.high = json.parse_number(what);
    } else if (k == "original_max_position_embeddings") {
      r.original = json.parse_integer(what);
    } else if (k == "partial_rotary_factor") {
      const double f = json.parse_number(what);
      if (f != 1.0) json.fail(what, " is ", f, ": accrue rotates every feature of a head (1.0)");
    } else {
      json.skip_value();
    }
  });
  return r;
}

// An int, or null (std::nullopt).
std::optional<int64_t> parse_optional_integer(JsonReader& json, const std::string& what) {
  if (json.consume_null()) return std::nullopt;
  return json.parse_integer(what);
}

std::string quoted(const std::string& key) {
  return "'" + key + "'";
}

}  // namespace

LlamaConfig parse_hf_config(const std::string& text, const std::string& name) {
  const FileRef file{"read_hf_config", name};
  const size_t bad = detail::find_invalid_utf8(text);
  ACCRUE_CHECK(bad == std::string::npos, file, ": the file is not valid UTF-8 (byte ", bad, ")");
  JsonReader json(text, file, "config JSON");

  std::optional<std::string> model_type, hidden_act;
  std::optional<int64_t> vocab, hidden, intermediate, layers, heads, kv_heads, head_dim,
      max_positions, bos;
  std::optional<double> rope_theta, rms_eps, init_range;
  std::optional<bool> tie, attention_bias;
  std::optional<RopeEntry> rope_scaling, rope_parameters;
  std::vector<int64_t> eos;
  std::set<std::string> seen;

  const auto integer = [&](std::optional<int64_t>& out, const std::string& key) {
    out = json.parse_integer(quoted(key));
  };
  const auto optional_integer = [&](std::optional<int64_t>& out, const std::string& key) {
    out = parse_optional_integer(json, quoted(key));
  };
  if (json.peek() != '{')
    json.fail("a config.json must be a JSON object, found ", json.describe_next());
  json.parse_object("the config", [&](const std::string& key) {
    if (!seen.insert(key).second) json.fail("duplicate key ", quoted(key));
    const std::string what = quoted(key);
    if (key == "model_type") {
      if (json.peek() != '"') json.fail(what, " must be a string, found ", json.describe_next());
      model_type = json.parse_string();
    } else if (key == "vocab_size") {
      integer(vocab, key);
    } else if (key == "hidden_size") {
      integer(hidden, key);
    } else if (key == "intermediate_size") {
      integer(intermediate, key);
    } else if (key == "num_hidden_layers") {
      integer(layers, key);
    } else if (key == "num_attention_heads") {
      integer(heads, key);
    } else if (key == "num_key_value_heads") {
      optional_integer(kv_heads, key);
    } else if (key == "head_dim") {
      optional_integer(head_dim, key);
    } else if (key == "max_position_embeddings") {
      integer(max_positions, key);
    } else if (key == "rope_theta") {
      rope_theta = json.parse_number(what);
    } else if (key == "rope_scaling") {
      if (!json.consume_null()) rope_scaling = parse_rope(json, key);
    } else if (key == "rope_parameters") {
      if (!json.consume_null()) rope_parameters = parse_rope(json, key);
    } else if (key == "rms_norm_eps") {
      rms_eps = json.parse_number(what);
    } else if (key == "initializer_range") {
      init_range = json.parse_number(what);
    } else if (key == "tie_word_embeddings") {
      tie = json.parse_bool(what);
    } else if (key == "attention_bias") {
      attention_bias = json.parse_bool(what);
    } else if (key == "mlp_bias") {
      if (json.parse_bool(what))
        json.fail(what, " is true: Llama and Qwen3 MLPs in accrue have no biases");
    } else if (key == "hidden_act") {
      if (json.peek() != '"') json.fail(what, " must be a string, found ", json.describe_next());
      hidden_act = json.parse_string();
      if (*hidden_act != "silu")
        json.fail(what, " is '", *hidden_act, "': only 'silu' (SwiGLU) is supported");
    } else if (key == "attention_dropout") {
      const double p = json.parse_number(what);
      if (p != 0.0) json.fail(what, " is ", p, ": attention dropout is not supported (0.0)");
    } else if (key == "use_sliding_window") {
      if (json.parse_bool(what))
        json.fail(what, " is true: sliding-window attention is not supported");
    } else if (key == "layer_types") {
      json.parse_array(what, [&](size_t i) {
        if (json.peek() != '"')
          json.fail(what, " item ", i, " must be a string, found ", json.describe_next());
        const std::string t = json.parse_string();
        if (t != "full_attention")
          json.fail(what, " item ", i, " is '", t,
                    "': only full_attention layers are supported (no sliding window)");
      });
    } else if (key == "quantization_config") {
      json.fail(what, " is present: quantized checkpoints are not supported");
    } else if (key == "bos_token_id") {
      optional_integer(bos, key);
    } else if (key == "eos_token_id") {
      if (json.consume_null()) return;
      if (json.peek() == '[') {
        json.parse_array(what, [&](size_t) { eos.push_back(json.parse_integer(what)); });
      } else {
        eos.push_back(json.parse_integer(what));
      }
    } else {
      json.skip_value();  // architectures, torch_dtype, use_cache, pretraining_tp, ...
    }
  });
  json.expect_end();

  ACCRUE_CHECK(model_type, file, ": the config has no 'model_type'");
  ACCRUE_CHECK(*model_type == "llama" || *model_type == "qwen3", file, ": model_type '",
               *model_type, "' is not supported (supported: 'llama', 'qwen3')");
  const bool qwen3 = *model_type == "qwen3";
  const std::pair<const char*, const std::optional<int64_t>*> required[] = {
      {"vocab_size", &vocab},
      {"hidden_size", &hidden},
      {"intermediate_size", &intermediate},
      {"num_hidden_layers", &layers},
      {"num_attention_heads", &heads}};
  for (const auto& [key, value] : required)
    ACCRUE_CHECK(value->has_value(), file, ": the config has no '", key, "'");

  LlamaConfig c;
  c.model_type = *model_type;
  c.vocab_size = *vocab;
  c.hidden = *hidden;
  c.intermediate = *intermediate;
  c.layers = *layers;
  c.heads = *heads;
  ACCRUE_CHECK(c.heads >= 1, file, ": 'num_attention_heads' must be >= 1, got ", c.heads);
  c.kv_heads = kv_heads.value_or(c.heads);
  // transformers' defaults: hidden_size // num_attention_heads, 2048 (Llama) or 32768 (Qwen3).
  c.head_dim = head_dim.value_or(c.hidden / c.heads);
  c.max_positions = max_positions.value_or(qwen3 ? 32768 : 2048);
  c.rms_eps = rms_eps.value_or(1e-6);
  c.initializer_range = init_range.value_or(0.02);
  c.tie_word_embeddings = tie.value_or(false);
  c.attention_bias = attention_bias.value_or(false);
  c.qk_norm = qwen3;
  c.bos_token_id = bos.value_or(-1);
  c.eos_token_ids = eos;

  // One rope description from rope_theta, rope_scaling and rope_parameters.
  if (rope_scaling && rope_parameters)
    ACCRUE_CHECK(!rope_scaling->type || !rope_parameters->type ||
                     *rope_scaling->type == *rope_parameters->type,
                 file, ": 'rope_scaling.rope_type' '", rope_scaling->type.value_or(""),
                 "' and 'rope_parameters.rope_type' '", rope_parameters->type.value_or(""),
                 "' differ");
  const RopeEntry rope = rope_parameters ? *rope_parameters : rope_scaling.value_or(RopeEntry{});
  if (rope_theta && rope.theta)
    ACCRUE_CHECK(*rope_theta == *rope.theta, file, ": 'rope_theta' ", *rope_theta,
                 " and 'rope_parameters.rope_theta' ", *rope.theta, " differ");
  c.rope_theta = rope.theta ? *rope.theta : rope_theta.value_or(10000.0);
  const std::string rope_key = rope_parameters ? "rope_parameters" : "rope_scaling";
  const std::string type = rope.type.value_or("default");
  if (type == "llama3") {
    const std::pair<const char*, const std::optional<double>*> fields[] = {
        {"factor", &rope.factor}, {"low_freq_factor", &rope.low}, {"high_freq_factor", &rope.high}};
    for (const auto& [key, value] : fields)
      ACCRUE_CHECK(value->has_value(), file, ": '", rope_key, "' of rope_type 'llama3' has no '",
                   key, "'");
    ACCRUE_CHECK(rope.original, file, ": '", rope_key,
                 "' of rope_type 'llama3' has no 'original_max_position_embeddings'");
    c.rope_scaling = {RopeScaling::Type::llama3, *rope.factor, *rope.low, *rope.high,
                      *rope.original};
  } else {
    ACCRUE_CHECK(type == "default", file, ": '", rope_key, ".rope_type' '", type,
                 "' is not supported (supported: 'default', 'llama3')");
  }
  return validated_hf_config(std::move(c), file);
}

LlamaConfig read_hf_config(const std::string& path) {
  return parse_hf_config(read_hf_config_text(path, "read_hf_config"), path);
}

std::string hf_config_json(const LlamaConfig& c) {
  c.validate();
  const bool qwen3 = c.model_type == "qwen3";
  ACCRUE_CHECK(c.qk_norm == qwen3, "write_hf_config: qk_norm ", c.qk_norm ? "true" : "false",
               " with model_type '", c.model_type,
               "': transformers has QK-norm in Qwen3ForCausalLM (model_type 'qwen3') only");
  // As transformers writes a config: keys sorted, two-space indent.
  std::vector<std::pair<std::string, std::string>> entries;
  const auto add = [&](const char* key, std::string value) {
    entries.emplace_back(key, std::move(value));
  };
  const auto number = [](double v) {
    std::string s;
    detail::append_json_double(s, v);
    return s;
  };
  const auto string = [](const std::string& v) {
    std::string s;
    detail::append_json_string(s, v);
    return s;
  };
  const auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  add("architectures",
      "[\n    " + string(qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM") + "\n  ]");
  add("attention_bias", boolean(c.attention_bias));
  add("attention_dropout", "0.0");
  add("bos_token_id", c.bos_token_id >= 0 ? std::to_string(c.bos_token_id) : "null");
  if (c.eos_token_ids.empty()) {
    add("eos_token_id", "null");
  } else if (c.eos_token_ids.size() == 1) {
    add("eos_token_id", std::to_string(c.eos_token_ids[0]));
  } else {
    std::string list = "[";
    for (size_t i = 0; i < c.eos_token_ids.size(); ++i)
      list += (i ? ",\n    " : "\n    ") + std::to_string(c.eos_token_ids[i]);
    add("eos_token_id", list + "\n  ]");
  }
  add("head_dim", std::to_string(c.head_dim));
  add("hidden_act", "\"silu\"");
  add("hidden_size", std::to_string(c.hidden));
  add("initializer_range", number(c.initializer_range));
  add("intermediate_size", std::to_string(c.intermediate));
  add("max_position_embeddings", std::to_string(c.max_positions));
  if (qwen3) add("max_window_layers", std::to_string(c.layers));
  if (!qwen3) add("mlp_bias", "false");
  add("model_type", string(c.model_type));
  add("num_attention_heads", std::to_string(c.heads));
  add("num_hidden_layers", std::to_string(c.layers));
  add("num_key_value_heads", std::to_string(c.kv_heads));
  add("rms_norm_eps", number(c.rms_eps));
  if (c.rope_scaling.type == RopeScaling::Type::llama3) {
    const RopeScaling& r = c.rope_scaling;
    add("rope_scaling", "{\n    \"factor\": " + number(r.factor) +
                            ",\n    \"high_freq_factor\": " + number(r.high_freq_factor) +
                            ",\n    \"low_freq_factor\": " + number(r.low_freq_factor) +
                            ",\n    \"original_max_position_embeddings\": " +
                            std::to_string(r.original_max_position_embeddings) +
                            ",\n    \"rope_type\": \"llama3\"\n  }");
  } else {
    add("rope_scaling", "null");
  }
  add("rope_theta", number(c.rope_theta));
  if (qwen3) add("sliding_window", "null");
  add("tie_word_embeddings", boolean(c.tie_word_embeddings));
  add("use_cache", "true");
  if (qwen3) add("use_sliding_window", "false");
  add("vocab_size", std::to_string(c.vocab_size));

  std::string out = "{\n";
  for (size_t i = 0; i < entries.size(); ++i) {
    out += "  \"" + entries[i].first + "\": " + entries[i].second;
    out += i + 1 < entries.size() ? ",\n" : "\n";
  }
  out += "}\n";
  return out;
}

void write_hf_config(const LlamaConfig& config, const std::string& path) {
  const std::string text = hf_config_json(config);
  detail::OutputFile out(FileRef{"write_hf_config", path});
  out.write(text);
  out.close();
}

}  // namespace accrue::nn
