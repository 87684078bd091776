// nn::LlamaConfig: presets against the parameter counts transformers
// reports, validation errors, config.json read (transformers 4 / Hub and
// transformers 5 layouts) and written, and the JSON cursor's additions (Note
// [Schema-driven JSON]).
#include "accrue/nn/llama_config.h"

#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "accrue/core/json.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using nn::LlamaConfig;
using nn::parse_hf_config;
using nn::RopeScaling;

// The counts of transformers 5.24's LlamaForCausalLM / Qwen3ForCausalLM built
// from these configs on the meta device (sum of p.numel() over parameters()).
TEST(LlamaConfig, PresetsMatchTransformersParameterCounts) {
  EXPECT_EQ(LlamaConfig::from_name("llama-125m").parameter_count(), 124668672);
  EXPECT_EQ(LlamaConfig::from_name("llama3.2-1b").parameter_count(), 1235814400);  // 1.24B
  EXPECT_EQ(LlamaConfig::from_name("qwen3-0.6b").parameter_count(), 596049920);    // 0.6B
  // The tiny fixtures of llama_hf_test.cpp, counted by make_hf_fixtures.py.
  LlamaConfig llama = LlamaConfig::llama_tiny();
  llama.vocab_size = 128;
  llama.hidden = 32;
  llama.intermediate = 64;
  llama.head_dim = 8;
  EXPECT_EQ(llama.parameter_count(), 26784);
  for (const std::string& name : LlamaConfig::preset_names())
    EXPECT_NO_THROW(LlamaConfig::from_name(name).validate()) << name;
}

TEST(LlamaConfig, PresetValues) {
  const LlamaConfig l = LlamaConfig::from_name("llama3.2-1b");
  EXPECT_EQ(l.layers, 16);
  EXPECT_EQ(l.hidden, 2048);
  EXPECT_EQ(l.heads, 32);
  EXPECT_EQ(l.kv_heads, 8);
  EXPECT_EQ(l.intermediate, 8192);
  EXPECT_EQ(l.vocab_size, 128256);
  EXPECT_TRUE(l.tie_word_embeddings);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_EQ(l.rope_scaling, (RopeScaling{RopeScaling::Type::llama3, 32.0, 1.0, 4.0, 8192}));
  EXPECT_EQ(l.rms_eps, 1e-5);
  const LlamaConfig q = LlamaConfig::from_name("qwen3-0.6b");
  EXPECT_EQ(q.model_type, "qwen3");
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_NE(q.head_dim * q.heads, q.hidden);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_TRUE(q.tie_word_embeddings);
  EXPECT_EQ(q.rope_theta, 1e6);
  EXPECT_EQ(q.rms_eps, 1e-6);
  const LlamaConfig s = LlamaConfig::from_name("llama-125m");
  EXPECT_EQ(s.layers, 12);
  EXPECT_EQ(s.kv_heads, 4);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_ERROR(LlamaConfig::from_name("llama-7b"), "unknown model 'llama-7b'", "llama3.2-1b");
}

TEST(LlamaConfig, ValidateNamesFieldAndValue) {
  LlamaConfig c = LlamaConfig::llama_tiny();
  c.kv_heads = 3;
  EXPECT_ERROR(c.validate(), "heads 4 is not a multiple of kv_heads 3");
  c = LlamaConfig::llama_tiny();
  c.head_dim = 15;
  EXPECT_ERROR(c.validate(), "head_dim 15 must be even");
  c.head_dim = 0;
  EXPECT_ERROR(c.validate(), "head_dim must be >= 1, got 0");
  c = LlamaConfig::llama_tiny();
  c.layers = -2;
  EXPECT_ERROR(c.validate(), "layers must be >= 1, got -2");
  c = LlamaConfig::llama_tiny();
  c.model_type = "mistral";
  EXPECT_ERROR(c.validate(), "model_type 'mistral'");
  c = LlamaConfig::llama_tiny();
  c.rms_eps = 0;
  EXPECT_ERROR(c.validate(), "rms_eps 0");
  c = LlamaConfig::llama_tiny();
  c.rope_theta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_ERROR(c.validate(), "rope_theta nan");
  c = LlamaConfig::llama_tiny();
  c.rope_scaling = {RopeScaling::Type::llama3, 8.0, 4.0, 4.0, 8192};
  EXPECT_ERROR(c.validate(), "high_freq_factor 4", "low_freq_factor 4");
  c = LlamaConfig::llama_tiny();
  c.eos_token_ids = {7, 256};
  EXPECT_ERROR(c.validate(), "eos_token_id 256", "[0, 256)");
  // Products that overflow int64 are refused, not wrapped (Note [Checked sizes]).
  c = LlamaConfig::llama_tiny();
  c.vocab_size = int64_t{1} << 40;
  c.hidden = int64_t{1} << 30;
  EXPECT_ERROR(c.validate(), "overflows int64", "vocab_size 1099511627776");
  c = LlamaConfig::llama_tiny();
  c.max_positions = int64_t{1} << 62;
  EXPECT_ERROR(c.validate(), "overflows int64", "max_positions 4611686018427387904");
}

// A Hub-style config.json (transformers 4: rope_theta + rope_scaling), the
// text of meta-llama/Llama-3.2-1B's.
const char* kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

TEST(HFConfig, ReadsHubLlama32AsThePreset) {
  EXPECT_EQ(parse_hf_config(kLlama32Config, "config.json"), LlamaConfig::llama3_2_1b());
}

// Hub configs of other releases (transformers 4 layout); the parameter
// counts are transformers 5.24's for the same configs (meta device).
TEST(HFConfig, ReadsHubLlama2Llama31AndQwen3) {
  const LlamaConfig llama2 = parse_hf_config(R"({"architectures": ["LlamaForCausalLM"],
      "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
      "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
      "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
      "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
      "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})",
                                             "llama2.json");
  EXPECT_EQ(llama2.head_dim, 128);
  EXPECT_EQ(llama2.rope_theta, 10000.0);
  EXPECT_EQ(llama2.parameter_count(), 6738415616);
  const LlamaConfig llama31 = parse_hf_config(R"({"architectures": ["LlamaForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
      "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
      "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
      "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
      "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})",
                                              "llama31.json");
  EXPECT_EQ(llama31.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(llama31.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama31.parameter_count(), 8030261248);
  const LlamaConfig qwen3 = parse_hf_config(R"({"architectures": ["Qwen3ForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
      "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
      "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
      "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})",
                                            "qwen3.json");
  EXPECT_EQ(qwen3, LlamaConfig::qwen3_0_6b());
}

TEST(HFConfig, ReadsTransformers5RopeParametersAndDefaults) {
  const LlamaConfig c = parse_hf_config(R"({"model_type": "qwen3", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
      "num_attention_heads": 4, "layer_types": ["full_attention", "full_attention"],
      "rope_parameters": {"rope_theta": 12345.5, "rope_type": "default"},
      "sliding_window": null, "eos_token_id": [1, 2, 3], "unknown": {"a": [1, {"b": null}], "c": -1.5e-3},
      "id2label": {"0": "LABEL_0"}})",
                                        "x.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.kv_heads, 4);   // num_key_value_heads defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);  // hidden_size / num_attention_heads
  EXPECT_EQ(c.max_positions, 32768);
  EXPECT_EQ(c.rope_theta, 12345.5);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::none);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HFConfig, RefusesNamingTheKeyAndValue) {
  const std::string base =
      R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4)";
  const auto cfg = [&](const std::string& extra) {
    return "{" + base + (extra.empty() ? "" : ", " + extra) + "}";
  };
  EXPECT_NO_THROW(parse_hf_config(cfg(R"("model_type": "llama")"), "ok.json"));
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "mistral")"), "m.json"),
               "read_hf_config('m.json')", "model_type 'mistral' is not supported");
  EXPECT_ERROR(parse_hf_config(cfg(""), "n.json"), "n.json", "no 'model_type'");
  EXPECT_ERROR(parse_hf_config(R"({"model_type": "llama", "vocab_size": 5})", "r.json"), "r.json",
               "no 'hidden_size'");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "hidden_act": "gelu")"), "a.json"),
               "a.json", "'hidden_act' is 'gelu'");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "mlp_bias": true)"), "b.json"),
               "'mlp_bias' is true");
  EXPECT_ERROR(
      parse_hf_config(cfg(R"("model_type": "qwen3", "use_sliding_window": true)"), "s.json"),
      "'use_sliding_window' is true");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "qwen3", "layer_types": ["full_attention",
                                      "sliding_attention"])"),
                               "l.json"),
               "'layer_types' item 1 is 'sliding_attention'");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "rope_scaling": {"rope_type": "yarn",
                             "factor": 4.0})"),
                               "y.json"),
               "y.json", "'rope_scaling.rope_type' 'yarn' is not supported");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "rope_scaling": {"type": "llama3",
                                      "factor": 4.0})"),
                               "y3.json"),
               "'rope_scaling' of rope_type 'llama3' has no 'low_freq_factor'");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "rope_theta": 10.0,
                             "rope_parameters": {"rope_theta": 20.0, "rope_type": "default"})"),
                               "t.json"),
               "'rope_theta' 10", "'rope_parameters.rope_theta' 20", "differ");
  EXPECT_ERROR(
      parse_hf_config(cfg(R"("model_type": "llama", "num_key_value_heads": 3)"), "kv.json"),
      "kv.json", "heads 4 is not a multiple of kv_heads 3");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "vocab_size": 7)"), "d.json"),
               "d.json", "duplicate key 'vocab_size'");
  EXPECT_ERROR(
      parse_hf_config(cfg(R"("model_type": "llama", "quantization_config": {})"), "q.json"),
      "'quantization_config' is present");
  EXPECT_ERROR(parse_hf_config(cfg(R"("model_type": "llama", "rope_theta": 1e999)"), "o.json"),
               "o.json", "1e999", "out of the range of a double");
  EXPECT_ERROR(parse_hf_config(R"({"model_type": "llama", "hidden_size": 64.5})", "f.json"),
               "expected an integer for 'hidden_size'", "64.5");
  EXPECT_ERROR(
      parse_hf_config(cfg(R"("model_type": "llama", "tie_word_embeddings": "yes")"), "tw.json"),
      "expected true or false for 'tie_word_embeddings', found a string");
  EXPECT_ERROR(
      parse_hf_config(cfg(R"("model_type": "llama", "attention_dropout": 0.1)"), "ad.json"),
      "'attention_dropout' is 0.1");
}

TEST(HFConfig, RefusesMalformedJson) {
  EXPECT_ERROR(parse_hf_config("", "e.json"), "read_hf_config('e.json')", "config JSON at byte 0",
               "found the end of the text");
  EXPECT_ERROR(parse_hf_config("[1]", "a.json"), "must be a JSON object, found an array");
  EXPECT_ERROR(parse_hf_config(R"({"model_type": "llama",})", "c.json"),
               "expected a key in the config");
  EXPECT_ERROR(parse_hf_config(R"({"model_type": "llama"} x)", "t.json"), "trailing characters");
  EXPECT_ERROR(parse_hf_config(R"({"x": [1, 2,]})", "s.json"), "expected a value");
  EXPECT_ERROR(parse_hf_config(R"({"x": 01})", "z.json"), "leading zero");
  EXPECT_ERROR(parse_hf_config(R"({"x": 1.})", "p.json"), "no digit after the decimal point");
  EXPECT_ERROR(parse_hf_config(R"({"x": tru})", "b.json"), "expected true or false");
  EXPECT_ERROR(parse_hf_config("{\"x\": \"\xff\"}", "u.json"), "not valid UTF-8");
  // Deep nesting is an error at the limit, not a stack overflow.
  std::string deep = "{\"x\": ";
  for (int i = 0; i < 100000; ++i)
    deep += '[';
  EXPECT_ERROR(parse_hf_config(deep, "deep.json"), "nested deeper than 64 levels");
  std::string ok = "{\"x\": " + std::string(64, '[') + std::string(64, ']') +
                   R"(, "model_type": "llama", "vocab_size": 1, "hidden_size": 8,
                   "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})";
  EXPECT_NO_THROW(parse_hf_config(ok, "ok.json"));
}

TEST(HFConfig, ReadsTheFileAndNamesIt) {
  const std::string missing =
      (std::filesystem::temp_directory_path() / "accrue_no_such_config.json").string();
  EXPECT_ERROR(nn::read_hf_config(missing), "accrue_no_such_config.json");
}

TEST(HFConfig, RoundTripsEveryPreset) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "accrue_llama_config_test.json").string();
  for (const std::string& name : LlamaConfig::preset_names()) {
    LlamaConfig c = LlamaConfig::from_name(name);
    c.initializer_range = 0.0123;
    nn::write_hf_config(c, path);
    EXPECT_EQ(nn::read_hf_config(path), c) << name;
  }
  LlamaConfig c = LlamaConfig::llama_tiny();
  c.eos_token_ids = {3, 4};
  c.bos_token_id = 0;
  c.attention_bias = true;
  c.rope_scaling = {RopeScaling::Type::llama3, 2.5, 0.5, 3.25, 64};
  c.rope_theta = 0.1 + 1e6;  // a double that needs 17 digits
  c.rms_eps = 3e-7;
  nn::write_hf_config(c, path);
  EXPECT_EQ(nn::read_hf_config(path), c);
  std::filesystem::remove(path);
  // transformers has QK-norm in Qwen3 only.
  c = LlamaConfig::llama_tiny();
  c.qk_norm = true;
  EXPECT_ERROR(nn::hf_config_json(c), "qk_norm true with model_type 'llama'");
}

TEST(HFConfig, WritesAsTransformersDoes) {
  const std::string text = nn::hf_config_json(LlamaConfig::llama3_2_1b());
  EXPECT_THAT(text, ::testing::HasSubstr("  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],"));
  EXPECT_THAT(text, ::testing::HasSubstr("\"rms_norm_eps\": 1e-05,"));
  EXPECT_THAT(text, ::testing::HasSubstr("\"rope_theta\": 500000.0,"));
  EXPECT_THAT(text, ::testing::HasSubstr("\"factor\": 32.0,"));
  EXPECT_THAT(nn::hf_config_json(LlamaConfig::qwen3_0_6b()),
              ::testing::HasSubstr("\"Qwen3ForCausalLM\""));
}

// Python's repr of a float, which json.dumps writes.
TEST(Json, DoublesAsPythonWritesThem) {
  const auto fmt = [](double v) {
    std::string s;
    detail::append_json_double(s, v);
    return s;
  };
  EXPECT_EQ(fmt(0.0), "0.0");
  EXPECT_EQ(fmt(1.0), "1.0");
  EXPECT_EQ(fmt(-2.5), "-2.5");
  EXPECT_EQ(fmt(500000.0), "500000.0");
  EXPECT_EQ(fmt(1e-5), "1e-05");
  EXPECT_EQ(fmt(1e-6), "1e-06");
  EXPECT_EQ(fmt(0.0001), "0.0001");
  EXPECT_EQ(fmt(0.02), "0.02");
  EXPECT_EQ(fmt(1e16), "1e+16");
  EXPECT_EQ(fmt(1e15), "1000000000000000.0");
  EXPECT_EQ(fmt(1.5e300), "1.5e+300");
  EXPECT_EQ(fmt(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(fmt(123.456), "123.456");
  EXPECT_ERROR(fmt(std::numeric_limits<double>::infinity()), "not a finite number");
}

TEST(Json, NumbersAreCheckedAndExact) {
  const std::string name = "n.json";
  const detail::FileRef file{"test", name};
  const auto number = [&](const std::string& text) {
    detail::JsonReader json(text, file, "test JSON");
    const double v = json.parse_number("x");
    json.expect_end();
    return v;
  };
  EXPECT_EQ(number("1e-05"), 1e-5);
  EXPECT_EQ(number("-0"), 0.0);
  EXPECT_TRUE(std::signbit(number("-0.0")));
  EXPECT_EQ(number("1E+2"), 100.0);
  EXPECT_EQ(number("0.30000000000000004"), 0.1 + 0.2);
  EXPECT_EQ(number("1e-400"), 0.0);  // underflow is a zero, as strtod
  EXPECT_EQ(number("0e99999999999999999999"), 0.0);
  EXPECT_ERROR(number("-1e400"), "out of the range of a double");
  EXPECT_ERROR(number("100000000000000000000e99999999999999999999"), "out of the range");
  EXPECT_ERROR(number("+1"), "expected a number for x");
  EXPECT_ERROR(number("1e"), "no digit in the exponent");
  EXPECT_ERROR(number("NaN"), "expected a number");
}

}  // namespace
}  // namespace accrue
