// Hugging Face Llama / Qwen3 checkpoint directories: transformers-written
// fixtures (fixtures/make_hf_fixtures.py: sharded, config.json of
// transformers 5) load with the right config and values; single-file and
// sharded saves round-trip; every malformed directory is refused naming the
// file and the value (Note [Checkpoint directories]).
#include "accrue/nn/llama_hf.h"

#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "accrue/core/tensor_io.h"
#include "accrue/nn/hf_checkpoint.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

namespace fs = std::filesystem;
using nn::LlamaConfig;

const std::string kFixtures = ACCRUE_NN_FIXTURES;

// A fresh, empty directory under the temporary directory.
std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("accrue_llama_hf_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A copy of a fixture directory to break.
std::string copy_fixture(const std::string& fixture, const std::string& name) {
  const std::string dir = fresh_dir(name);
  fs::copy(fs::path(kFixtures) / fixture, dir, fs::copy_options::recursive);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double sum(const Tensor& t) {
  const Tensor d = t.to(DType::f64).contiguous();
  double s = 0;
  for (int64_t i = 0; i < d.numel(); ++i)
    s += static_cast<const double*>(d.data_ptr())[i];
  return s;
}

// The fixture's sums.txt ("name numel sum" per tensor) against what loaded.
void expect_fixture_values(const std::string& fixture, const nn::HFLlamaCheckpoint& ckpt) {
  std::ifstream in(fs::path(kFixtures) / fixture / "sums.txt");
  ASSERT_TRUE(in) << fixture;
  std::string name;
  int64_t numel = 0;
  double expected = 0;
  size_t lines = 0;
  while (in >> name >> numel >> expected) {
    ++lines;
    auto it = ckpt.tensors.find(name);
    ASSERT_NE(it, ckpt.tensors.end()) << name;
    EXPECT_EQ(it->second.numel(), numel) << name;
    EXPECT_EQ(it->second.dtype(), DType::f32) << name;
    // f32 values summed in f64 in a different order than torch's: close, not equal.
    EXPECT_NEAR(sum(it->second), expected, 1e-9 * std::max(1.0, std::abs(expected))) << name;
  }
  EXPECT_EQ(lines, ckpt.tensors.size());
}

std::map<std::string, Tensor> random_tensors(const LlamaConfig& c) {
  std::map<std::string, Tensor> out;
  for (const nn::HFLlamaTensor& spec : nn::hf_llama_tensors(c))
    out.emplace(spec.name, test::random_normal(spec.shape));
  return out;
}

TEST(HFLlama, TransformersLlamaFixtureLoads) {
  const nn::HFLlamaCheckpoint ckpt =
      nn::load_hf_llama_checkpoint((fs::path(kFixtures) / "hf_llama_tiny").string());
  const LlamaConfig& c = ckpt.config;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128);
  EXPECT_EQ(c.hidden, 32);
  EXPECT_EQ(c.intermediate, 64);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.max_positions, 256);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, (nn::RopeScaling{nn::RopeScaling::Type::llama3, 4.0, 1.0, 4.0, 64}));
  EXPECT_EQ(c.rms_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.parameter_count(), 26784);  // transformers' count (make_hf_fixtures.py)
  EXPECT_EQ(ckpt.tensors.size(), nn::hf_llama_tensors(c).size());
  expect_fixture_values("hf_llama_tiny", ckpt);
  // Sharded: the tensors came from three files.
  std::set<std::string> files;
  for (const auto& [name, file] : ckpt.sources)
    files.insert(fs::path(file).filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"}));
}

TEST(HFLlama, TransformersQwen3FixtureLoads) {
  const nn::HFLlamaCheckpoint ckpt =
      nn::load_hf_llama_checkpoint((fs::path(kFixtures) / "hf_qwen3_tiny").string());
  const LlamaConfig& c = ckpt.config;
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 16);  // apart from hidden / heads = 8
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.max_positions, 512);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, nn::RopeScaling::Type::none);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.parameter_count(), 28896);
  EXPECT_EQ(ckpt.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(ckpt.tensors.at("model.layers.1.self_attn.q_norm.weight").shape(), (Shape{16}));
  expect_fixture_values("hf_qwen3_tiny", ckpt);
}

TEST(HFLlama, NamesAndShapesCoverTheParameterCount) {
  for (const std::string& preset : LlamaConfig::preset_names()) {
    LlamaConfig c = LlamaConfig::from_name(preset);
    for (bool bias : {false, true}) {
      c.attention_bias = bias;
      int64_t total = 0;
      for (const nn::HFLlamaTensor& t : nn::hf_llama_tensors(c)) {
        int64_t n = 1;
        for (int64_t s : t.shape)
          n *= s;
        total += n;
      }
      EXPECT_EQ(total, c.parameter_count()) << preset << " bias " << bias;
    }
  }
  const auto names = nn::hf_llama_tensors(LlamaConfig::qwen3_tiny());
  EXPECT_EQ(names.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(names[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[1].shape, (Shape{128, 64}));  // 4 heads of 32 over hidden 64
  EXPECT_EQ(names[5].name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(names.back().name, "model.norm.weight");  // tied: no lm_head
  EXPECT_EQ(nn::hf_llama_tensors(LlamaConfig::llama_tiny()).back().name, "lm_head.weight");
}

TEST(HFLlama, SavesSingleAndShardedAndLoadsBack) {
  for (const std::string& preset : {std::string("llama-tiny"), std::string("qwen3-tiny")}) {
    LlamaConfig c = LlamaConfig::from_name(preset);
    c.eos_token_ids = {9};
    const std::map<std::string, Tensor> tensors = random_tensors(c);
    const std::string dir = fresh_dir("roundtrip_" + preset);
    for (int64_t limit : {int64_t{1} << 30, int64_t{20000}, int64_t{1}}) {
      nn::save_hf_llama_checkpoint(dir, c, tensors, limit);
      const bool single = limit == int64_t{1} << 30;
      EXPECT_EQ(fs::exists(fs::path(dir) / "model.safetensors"), single);
      EXPECT_EQ(fs::exists(fs::path(dir) / "model.safetensors.index.json"), !single);
      const nn::HFLlamaCheckpoint back = nn::load_hf_llama_checkpoint(dir);
      EXPECT_EQ(back.config, c);
      ASSERT_EQ(back.tensors.size(), tensors.size());
      for (const auto& [name, t] : tensors)
        EXPECT_TRUE(test::all_equal(back.tensors.at(name), t)) << name;
      std::set<std::string> files;
      for (const auto& [name, file] : back.sources)
        files.insert(file);
      if (limit == 1) {
        EXPECT_EQ(files.size(), tensors.size());  // one tensor per shard
      }
    }
    // The shard files of the last save and nothing stale.
    size_t shards = 0;
    for (const auto& entry : fs::directory_iterator(dir))
      shards += entry.path().extension() == ".safetensors";
    EXPECT_EQ(shards, tensors.size());
  }
}

TEST(HFLlama, WritesTheIndexAsTransformers) {
  const std::string dir = fresh_dir("index_format");
  const Tensor a = test::random_normal({4}), b = test::random_normal({3});
  nn::save_safetensors_dir(dir, {{"b", b}, {"a", a}}, 16);
  EXPECT_EQ(read_text(dir + "/model.safetensors.index.json"),
            "{\n  \"metadata\": {\n    \"total_size\": 28\n  },\n  \"weight_map\": {\n"
            "    \"a\": \"model-00002-of-00002.safetensors\",\n"
            "    \"b\": \"model-00001-of-00002.safetensors\"\n  }\n}\n");
  std::map<std::string, std::string> metadata;
  load_safetensors(dir + "/model-00001-of-00002.safetensors", &metadata);
  EXPECT_EQ(metadata.at("format"), "pt");
}

TEST(HFLlama, ShardSizesAsTransformersReadsThem) {
  EXPECT_EQ(nn::parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(nn::parse_shard_size("50KB"), 50'000);
  EXPECT_EQ(nn::parse_shard_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(nn::parse_shard_size("1.5mib"), 1'572'864);
  EXPECT_EQ(nn::parse_shard_size("123"), 123);
  EXPECT_EQ(nn::parse_shard_size("100B"), 100);
  EXPECT_EQ(nn::parse_shard_size("8Gb"), 1'000'000'000);  // bits, as transformers
  EXPECT_EQ(nn::parse_shard_size("8gB"), 8'000'000'000);
  EXPECT_ERROR(nn::parse_shard_size("5 GB"), "max shard size '5 GB'");
  EXPECT_ERROR(nn::parse_shard_size("GB"), "'GB'");
  EXPECT_ERROR(nn::parse_shard_size("0"), "at least one byte");
  EXPECT_ERROR(nn::parse_shard_size("-5GB"), "'-5GB'");
  EXPECT_ERROR(nn::parse_shard_size("1e30TB"), "'1e30TB'");
  EXPECT_ERROR(nn::parse_shard_size("nan"), "'nan'");
}

TEST(HFLlama, RefusesBadConfigs) {
  std::string dir = copy_fixture("hf_llama_tiny", "bad_json");
  write_text(dir + "/config.json", "{\"model_type\": \"llama\", ");
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "bad_json/config.json", "config JSON at byte");
  dir = copy_fixture("hf_llama_tiny", "bad_model_type");
  std::string text = read_text(dir + "/config.json");
  text.replace(text.find("\"llama\""), 7, "\"gemma2\"");
  write_text(dir + "/config.json", text);
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "bad_model_type/config.json",
               "model_type 'gemma2' is not supported");
  dir = copy_fixture("hf_llama_tiny", "no_config");
  fs::remove(dir + "/config.json");
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "no_config/config.json");
}

TEST(HFLlama, RefusesBadShards) {
  // A missing shard: named with a tensor the index puts there.
  std::string dir = copy_fixture("hf_qwen3_tiny", "missing_shard");
  fs::remove(dir + "/model-00002-of-00003.safetensors");
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "missing_shard/model-00002-of-00003.safetensors",
               "does not exist", "model.layers.0.input_layernorm.weight");

  // A tensor in two shards.
  dir = fresh_dir("two_shards");
  const Tensor x = test::random_normal({2, 2});
  save_safetensors(dir + "/s1.safetensors", {{"w", x}, {"v", x}});
  save_safetensors(dir + "/s2.safetensors", {{"w", x}});
  write_text(dir + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 48}, "weight_map": {"w": "s1.safetensors",
                 "v": "s2.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "tensor 'w' is in two shards",
               "two_shards/s1.safetensors", "two_shards/s2.safetensors");

  // A shard holding a tensor the index puts elsewhere, or does not list.
  dir = fresh_dir("misplaced");
  save_safetensors(dir + "/s1.safetensors", {{"w", x}});
  save_safetensors(dir + "/s2.safetensors", {{"v", x}});
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "s2.safetensors", "v": "s1.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "misplaced/model.safetensors.index.json",
               "misplaced/s2.safetensors", "holds tensor 'v'", "puts in 's1.safetensors'");
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "s1.safetensors", "u": "s2.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "misplaced/s2.safetensors", "holds tensor 'v'",
               "does not list");
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "s1.safetensors", "v": "s2.safetensors",
                 "u": "s2.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "puts tensor 'u'", "misplaced/s2.safetensors",
               "does not hold it");

  // Shard names cannot leave the directory.
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "../misplaced/s1.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "'../misplaced/s1.safetensors'",
               "not a plain file name");
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map": {"w": "config.json"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "'config.json'", "not a .safetensors file");
  write_text(dir + "/model.safetensors.index.json", R"({"weight_map": [1, 2]})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "index JSON at byte",
               "expected an object for 'weight_map', found an array");
  write_text(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "has no 'weight_map'");
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "s1.safetensors", "w": "s1.safetensors"}})");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "lists tensor 'w' twice");

  // Both layouts, or neither.
  save_safetensors(dir + "/model.safetensors", {{"w", x}});
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "both model.safetensors and",
               "model.safetensors.index.json");
  dir = fresh_dir("empty");
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "empty", "neither model.safetensors nor");
  // A damaged shard is refused by the safetensors reader, naming it.
  dir = copy_fixture("hf_llama_tiny", "truncated");
  fs::resize_file(dir + "/model-00003-of-00003.safetensors", 100);
  EXPECT_ERROR(nn::load_safetensors_dir(dir), "truncated/model-00003-of-00003.safetensors");
}

// The transformers fixture with one tensor taken out of its shard: refused
// by the index while it still lists the tensor, and as a missing tensor once
// the index agrees.
TEST(HFLlama, RefusesFixtureWithoutATensor) {
  const std::string dir = copy_fixture("hf_llama_tiny", "missing_tensor");
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  std::map<std::string, std::string> where;
  nn::load_safetensors_dir(dir, &where);
  const std::string shard = where.at(name);
  auto tensors = load_safetensors(shard);
  tensors.erase(name);
  save_safetensors(shard, tensors, {{"format", "pt"}});
  const std::string shard_file = fs::path(shard).filename().string();
  const std::string puts = "puts tensor '" + name + "'";
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "missing_tensor", puts.c_str(),
               shard_file.c_str(), "does not hold it");
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::string index = read_text(index_path);
  const size_t at = index.find("    \"" + name + "\"");
  ASSERT_NE(at, std::string::npos);
  index.erase(at, index.find('\n', at) + 1 - at);
  write_text(index_path, index);
  const std::string missing = "Llama checkpoint: missing tensor '" + name + "' of shape [32, 64]";
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "load_hf_llama_checkpoint(", "missing_tensor",
               missing.c_str());
}

TEST(HFLlama, RefusesWrongTensors) {
  const LlamaConfig c = LlamaConfig::llama_tiny();
  const std::map<std::string, Tensor> good = random_tensors(c);
  const std::map<std::string, std::string> sources = {
      {"model.layers.1.mlp.up_proj.weight", "dir/model-00002-of-00003.safetensors"}};
  EXPECT_NO_THROW(nn::check_hf_llama_tensors(c, good));

  std::map<std::string, Tensor> t = good;
  t["model.layers.1.mlp.up_proj.weight"] = test::random_normal({64, 128});
  EXPECT_ERROR(nn::check_hf_llama_tensors(c, t, &sources), "Llama checkpoint",
               "tensor 'model.layers.1.mlp.up_proj.weight'",
               "(in 'dir/model-00002-of-00003.safetensors')", "has shape [64, 128]",
               "expected [128, 64]");
  t = good;
  t.erase("model.layers.0.self_attn.v_proj.weight");
  EXPECT_ERROR(nn::check_hf_llama_tensors(c, t), "missing tensor",
               "'model.layers.0.self_attn.v_proj.weight' of shape [32, 64]");
  t = good;
  t["model.layers.0.self_attn.q_proj.bias"] = test::random_normal({64});
  EXPECT_ERROR(nn::check_hf_llama_tensors(c, t), "unexpected tensor",
               "'model.layers.0.self_attn.q_proj.bias'", "attention_bias false");
  t = good;
  t["model.layers.2.mlp.up_proj.weight"] = test::random_normal({128, 64});
  EXPECT_ERROR(nn::check_hf_llama_tensors(c, t), "'model.layers.2.mlp.up_proj.weight'", "layer 2",
               "num_hidden_layers 2");
  t = good;
  t.erase("model.layers.1.input_layernorm.weight");
  LlamaConfig three = c;
  three.layers = 3;
  EXPECT_ERROR(nn::check_hf_llama_tensors(three, good), "missing tensor",
               "'model.layers.2.self_attn.q_proj.weight'",
               "the checkpoint has 2 layers, the config num_hidden_layers 3");
  t = good;
  t["model.embed_tokens.weight"] = zeros({256, 64}, DType::i64);
  EXPECT_ERROR(nn::check_hf_llama_tensors(c, t), "'model.embed_tokens.weight'", "dtype i64");
  // A rotary buffer of older checkpoints is ignored.
  t = good;
  t["model.layers.0.self_attn.rotary_emb.inv_freq"] = test::random_normal({8});
  EXPECT_NO_THROW(nn::check_hf_llama_tensors(c, t));

  // Tied: lm_head may be a copy of the embedding, nothing else.
  const LlamaConfig q = LlamaConfig::qwen3_tiny();
  std::map<std::string, Tensor> tied = random_tensors(q);
  tied["lm_head.weight"] = tied.at("model.embed_tokens.weight").clone();
  EXPECT_NO_THROW(nn::check_hf_llama_tensors(q, tied));
  tied["lm_head.weight"] = test::random_normal({256, 64});
  EXPECT_ERROR(nn::check_hf_llama_tensors(q, tied), "Qwen3 checkpoint", "'lm_head.weight'",
               "is not a copy of 'model.embed_tokens.weight'", "tie_word_embeddings true");
  tied.erase("lm_head.weight");
  tied["model.layers.0.self_attn.q_norm.weight"] = test::random_normal({32});
  EXPECT_NO_THROW(nn::check_hf_llama_tensors(q, tied));
  EXPECT_ERROR(nn::check_hf_llama_tensors(c,
                                          [&] {
                                            auto u = good;
                                            u["model.layers.0.self_attn.q_norm.weight"] =
                                                test::random_normal({16});
                                            return u;
                                          }()),
               "unexpected tensor", "q_norm", "model_type is not qwen3");

  // Through a directory: the file of a misshapen tensor is named.
  const std::string dir = fresh_dir("misshapen");
  nn::save_hf_llama_checkpoint(dir, c, good, 20000);
  std::map<std::string, std::string> where;
  auto loaded = nn::load_safetensors_dir(dir, &where);
  const std::string shard = where.at("model.norm.weight");
  auto shard_tensors = load_safetensors(shard);
  shard_tensors["model.norm.weight"] = test::random_normal({31});
  save_safetensors(shard, shard_tensors);
  const std::string shard_file = fs::path(shard).filename().string();
  EXPECT_ERROR(nn::load_hf_llama_checkpoint(dir), "load_hf_llama_checkpoint", "'model.norm.weight'",
               shard_file.c_str(), "has shape [31], expected [64]");
  EXPECT_ERROR(nn::save_hf_llama_checkpoint(dir, three, good), "save_hf_llama_checkpoint",
               "missing tensor");
}

}  // namespace
}  // namespace accrue
