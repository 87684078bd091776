// Hugging Face GPT-2 safetensors <-> nn::GPT2: names, Conv1D layouts, the
// padded vocabulary, ignored buffers, tied lm_head, errors, and loading into
// a model an optim::ParamStore already holds (Note [One load path]).
#include "accrue/nn/gpt2_hf.h"

#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/tensor_io.h"
#include "accrue/nn/hf_checkpoint.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// Vocabulary 120 padded to 128 rows: the file has 120, the model 128.
nn::GPT2Config hf_config(int64_t n_layer = 2) {
  nn::GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 120;
  return c;
}

std::unique_ptr<nn::GPT2> make_gpt2(const nn::GPT2Config& c, uint64_t seed,
                                    DType dtype = DType::f64) {
  Generator gen(seed);
  return std::make_unique<nn::GPT2>(c, nn::ParamOptions{Device::cpu(), dtype, &gen});
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("accrue_gpt2_hf_" + name + ".safetensors"))
      .string();
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return randint(0, vocab, {B, T}, DType::i64, Device::cpu(), &gen);
}

bool is_conv1d(const std::string& name) {
  for (const char* s :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    const std::string suffix = s;
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  }
  return false;
}

// An HF GPT2LMHeadModel file's tensors, written out by hand from a model (not
// through params_to_hf_gpt2): Conv1D weights transposed, wte's real rows,
// the causal-mask buffers, and lm_head.weight as a copy of wte.
std::map<std::string, Tensor> hand_built_hf(const nn::GPT2& model) {
  const nn::GPT2Config& c = model.config();
  std::map<std::string, Tensor> hf;
  NoGradGuard no_grad;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    Tensor t = detach(p.tensor).clone();
    std::string name = "transformer." + p.name;
    if (p.name == "wte") {
      t = t.narrow(0, 0, c.vocab_size).contiguous();
      name = "transformer.wte.weight";
    } else if (p.name == "wpe") {
      name = "transformer.wpe.weight";
    } else if (is_conv1d(p.name)) {
      t = t.transpose(0, 1).contiguous();
    }
    hf[name] = t;
  }
  hf["lm_head.weight"] = hf.at("transformer.wte.weight").clone();
  // The causal masks of older files: a lower-triangular [1, 1, S, S] and a scalar.
  std::vector<float> tril(c.block_size * c.block_size, 0.0f);
  for (int64_t i = 0; i < c.block_size; ++i)
    for (int64_t j = 0; j <= i; ++j)
      tril[i * c.block_size + j] = 1.0f;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".attn.";
    hf[h + "bias"] = from_vector(tril, {1, 1, c.block_size, c.block_size}, DType::f32);
    hf[h + "masked_bias"] = scalar_tensor(-1e4, DType::f32);
  }
  return hf;
}

void expect_same_parameters(const nn::GPT2& a, const nn::GPT2& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(test::all_equal(pb[i].tensor, pa[i].tensor)) << pa[i].name;
}

TEST(GPT2HF, tensor_list_maps_names_and_layouts) {
  const nn::GPT2Config c = hf_config();
  const std::vector<nn::HFTensor> specs = nn::hf_gpt2_tensors(c);
  const auto model = make_gpt2(c, 1);
  const auto params = model->named_parameters();
  ASSERT_EQ(specs.size(), params.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].param_name, params[i].name);
    EXPECT_EQ(specs[i].param_shape, params[i].tensor.shape()) << specs[i].param_name;
    EXPECT_EQ(specs[i].transposed, is_conv1d(specs[i].param_name)) << specs[i].param_name;
  }
  EXPECT_EQ(specs[0].hf_name, "transformer.wte.weight");
  EXPECT_EQ(specs[0].hf_shape, (Shape{120, 32}));
  EXPECT_EQ(specs[0].param_shape, (Shape{128, 32}));
  EXPECT_EQ(specs[1].hf_name, "transformer.wpe.weight");
  EXPECT_EQ(specs[4].hf_name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(specs[4].hf_shape, (Shape{32, 96}));  // Conv1D [in, out]
  EXPECT_EQ(specs[10].hf_name, "transformer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(specs[10].hf_shape, (Shape{32, 128}));
  EXPECT_EQ(specs[12].hf_shape, (Shape{128, 32}));  // mlp.c_proj
  EXPECT_EQ(specs.back().hf_name, "transformer.ln_f.bias");

  EXPECT_TRUE(nn::is_hf_gpt2_buffer("transformer.h.0.attn.bias"));
  EXPECT_TRUE(nn::is_hf_gpt2_buffer("transformer.h.11.attn.masked_bias"));
  EXPECT_TRUE(nn::is_hf_gpt2_buffer("h.3.attn.bias"));
  EXPECT_FALSE(nn::is_hf_gpt2_buffer("transformer.h.0.attn.c_attn.bias"));
  EXPECT_FALSE(nn::is_hf_gpt2_buffer("transformer.h.0.ln_1.bias"));
  EXPECT_FALSE(nn::is_hf_gpt2_buffer("transformer.h.x.attn.bias"));
  EXPECT_FALSE(nn::is_hf_gpt2_buffer("transformer.h.0.attn.bias.x"));
  EXPECT_FALSE(nn::is_hf_gpt2_buffer("transformer.wte.weight"));
}

TEST(GPT2HF, save_then_load_round_trips_bitwise) {
  const nn::GPT2Config c = hf_config();
  const auto a = make_gpt2(c, 2);
  const std::string path = temp_path("round_trip");
  nn::save_hf_gpt2(*a, path);

  std::map<std::string, std::string> meta;
  const std::map<std::string, Tensor> file = load_safetensors(path, &meta);
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(file.size(), nn::hf_gpt2_tensors(c).size());
  EXPECT_EQ(file.count("lm_head.weight"), 0u);  // tied: not saved
  EXPECT_EQ(file.at("transformer.wte.weight").shape(), (Shape{120, 32}));
  {
    NoGradGuard no_grad;
    const Tensor w = a->block(1).attn().c_attn().weight();
    EXPECT_TRUE(test::all_equal(file.at("transformer.h.1.attn.c_attn.weight"), w.transpose(0, 1)));
  }

  const auto b = make_gpt2(c, 3);
  nn::load_hf_gpt2(*b, path);
  expect_same_parameters(*a, *b);
  // Saving the loaded model writes the same bytes.
  const std::string again = temp_path("round_trip_again");
  nn::save_hf_gpt2(*b, again);
  for (const auto& [name, t] : load_safetensors(again))
    EXPECT_TRUE(test::all_equal(t, file.at(name))) << name;
  std::filesystem::remove(path);
  std::filesystem::remove(again);
}

TEST(GPT2HF, a_hand_built_hf_file_loads_and_gives_the_same_forward) {
  const nn::GPT2Config c = hf_config();
  const auto a = make_gpt2(c, 4, DType::f32);  // HF checkpoints are f32
  const std::string path = temp_path("hand_built");
  save_safetensors(path, hand_built_hf(*a));
  const auto b = make_gpt2(c, 5, DType::f32);
  nn::load_hf_gpt2(*b, path);
  expect_same_parameters(*a, *b);
  const Tensor idx = tokens(2, 16, c.vocab_size, 6);
  NoGradGuard no_grad;
  EXPECT_TRUE(test::all_equal(b->forward(idx), a->forward(idx)));
  // Into an f64 model: the f32 values, exactly.
  const auto d = make_gpt2(c, 7, DType::f64);
  nn::load_hf_gpt2(*d, path);
  const auto pa = a->parameters(), pd = d->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(test::all_equal(pd[i], pa[i].to(DType::f64))) << i;
  std::filesystem::remove(path);
}

TEST(GPT2HF, names_without_the_transformer_prefix_load_too) {
  const nn::GPT2Config c = hf_config();
  const auto a = make_gpt2(c, 8);
  std::map<std::string, Tensor> hf;
  for (const auto& [name, t] : hand_built_hf(*a))
    hf[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = t;
  EXPECT_EQ(hf.count("h.0.attn.c_attn.weight"), 1u);
  const std::map<std::string, Tensor> params = nn::params_from_hf_gpt2(c, hf);
  for (const nn::NamedParameter& p : a->named_parameters())
    EXPECT_TRUE(test::all_equal(params.at(p.name), p.tensor)) << p.name;
}

TEST(GPT2HF, missing_extra_and_misshapen_tensors_are_named) {
  const nn::GPT2Config c = hf_config();
  const auto a = make_gpt2(c, 9);
  const std::map<std::string, Tensor> good = hand_built_hf(*a);
  EXPECT_EQ(nn::params_from_hf_gpt2(c, good).size(), a->named_parameters().size());

  auto without = good;
  without.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, without), "missing tensor",
               "'transformer.h.1.mlp.c_fc.bias'", "[128]");

  auto extra = good;
  extra["transformer.h.0.attn.rotary"] = zeros({4});
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, extra), "unexpected tensor",
               "'transformer.h.0.attn.rotary'", "[4]");

  auto linear_layout = good;
  linear_layout["transformer.h.0.attn.c_attn.weight"] = zeros({96, 32});
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, linear_layout), "'transformer.h.0.attn.c_attn.weight'",
               "has shape [96, 32]", "expected [32, 96]", "Conv1D");

  auto padded = good;
  padded["transformer.wte.weight"] = zeros({128, 32});
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, padded), "'transformer.wte.weight'", "[128, 32]",
               "[120, 32]");

  auto untied = good;
  untied["lm_head.weight"] = test::random_normal({120, 32}, DType::f64);
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, untied), "'lm_head.weight'", "ties");

  auto twice = good;
  twice["wpe.weight"] = good.at("transformer.wpe.weight");
  EXPECT_ERROR(nn::params_from_hf_gpt2(c, twice), "'transformer.wpe.weight'", "'wpe.weight'");

  // A file of another depth, through the file reader: the path, then the layer counts.
  const auto deeper = make_gpt2(hf_config(3), 10);
  const std::string path = temp_path("deeper");
  nn::save_hf_gpt2(*deeper, path);
  const auto b = make_gpt2(c, 11);
  EXPECT_ERROR(nn::load_hf_gpt2(*b, path), path.c_str(), "the file has 3 layers", "n_layer 2");
  EXPECT_ERROR(nn::load_hf_gpt2(*b, temp_path("does_not_exist")), "does_not_exist");
  std::filesystem::remove(path);
}

TEST(GPT2HF, loading_into_a_store_updates_master_and_compute_copy) {
  const nn::GPT2Config c = hf_config();
  const auto a = make_gpt2(c, 12, DType::f32);
  const std::string path = temp_path("arena");
  nn::save_hf_gpt2(*a, path);
  for (DType compute : {DType::f32, DType::bf16}) {
    const auto b = make_gpt2(c, 13, DType::f32);
    std::vector<Tensor> params = b->parameters();
    optim::ParamStore arena(params, optim::ParamStoreOptions().compute_dtype(compute));
    nn::load_hf_gpt2(*b, path);
    const auto pa = a->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(test::all_equal(arena.master_view(i), pa[i])) << i;
      // The model computes in the compute slot: the master's values, cast.
      EXPECT_EQ(params[i].dtype(), compute);
      EXPECT_TRUE(test::all_equal(params[i], detach(pa[i]).to(compute))) << i;
    }
  }
  std::filesystem::remove(path);
}

// Note [One load path]: an HF file loaded into a model whose store already
// holds a bf16 compute copy trains exactly as the same file loaded before the
// store was built: the same master, compute copy and moments after every window.
TEST(GPT2HF, loading_after_a_bf16_store_exists_trains_as_loading_before) {
  const nn::GPT2Config c = hf_config();
  const std::string path = temp_path("train");
  nn::save_hf_gpt2(*make_gpt2(c, 21, DType::f32), path);
  struct Run {
    std::unique_ptr<nn::GPT2> model;
    std::unique_ptr<optim::ParamStore> store;
    std::unique_ptr<optim::Optimizer> opt;
    std::unique_ptr<optim::Window> window;
  };
  auto make_run = [&](bool load_first) {
    Run r;
    r.model = make_gpt2(c, 22, DType::f32);  // other weights until the load
    if (load_first) nn::load_hf_gpt2(*r.model, path);
    r.opt = std::make_unique<optim::Optimizer>(optim::AdamWOptions(1e-2).weight_decay(0.1));
    r.store = std::make_unique<optim::ParamStore>(
        r.model->parameters(),
        optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(r.opt->moments_needed()));
    if (!load_first) nn::load_hf_gpt2(*r.model, path);
    r.window = std::make_unique<optim::Window>(
        *r.store, *r.opt, optim::WindowOptions().micro_steps(2).max_grad_norm(1.0));
    return r;
  };
  Run before = make_run(true), after = make_run(false);
  EXPECT_TRUE(test::all_equal(before.store->master(), after.store->master()));
  EXPECT_TRUE(test::all_equal(before.store->compute(), after.store->compute()));
  for (int w = 0; w < 3; ++w) {
    for (int k = 0; k < 2; ++k) {
      const Tensor idx = tokens(2, 16, c.vocab_size, 100 + 2 * w + k);
      const Tensor targets = tokens(2, 16, c.vocab_size, 200 + 2 * w + k);
      for (Run* r : {&before, &after})
        r->window->backward(r->model->loss(idx, targets));
    }
    for (Run* r : {&before, &after})
      r->window->close();
    EXPECT_EQ(before.window->report().loss, after.window->report().loss) << "window " << w;
    EXPECT_TRUE(test::all_equal(before.store->master(), after.store->master())) << w;
    EXPECT_TRUE(test::all_equal(before.store->compute(), after.store->compute())) << w;
    EXPECT_TRUE(test::all_equal(before.store->moment(1), after.store->moment(1))) << w;
  }
  EXPECT_FALSE(before.window->report().skipped);
  std::filesystem::remove(path);
}

// A transformers GPT2Config.to_json_string() of hf_config()'s sizes, with
// `extra` keys spliced in first (later duplicates are refused, so tests that
// change a key give one the text lacks).
std::string transformers_config(const std::string& extra = "", bool with_positions = true) {
  return "{" + extra +
         R"("activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
  "n_embd": 32, "n_head": 4, "n_inner": null, "n_layer": 2,)" +
         std::string(with_positions ? R"( "n_positions": 16,)" : "") +
         R"( "reorder_and_upcast_attn": false, "resid_pdrop": 0.1,
  "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
  "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "torch_dtype": "float32", "transformers_version": "4.57.0", "use_cache": true,
  "vocab_size": 120})";
}

TEST(GPT2HFConfig, reads_a_transformers_config) {
  const nn::GPT2Config c = nn::parse_hf_gpt2_config(transformers_config(), "config.json");
  const nn::GPT2Config want = hf_config();
  EXPECT_EQ(c.n_layer, want.n_layer);
  EXPECT_EQ(c.n_head, want.n_head);
  EXPECT_EQ(c.n_embd, want.n_embd);
  EXPECT_EQ(c.block_size, want.block_size);
  EXPECT_EQ(c.vocab_size, want.vocab_size);
  EXPECT_EQ(c.padded_vocab(), want.padded_vocab());
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(nn::hf_model_type(transformers_config(), "config.json"), "gpt2");
  EXPECT_EQ(nn::hf_model_type("{\"n_layer\": 2}", "config.json"), "");
  // Older files: n_ctx beside or instead of n_positions, and the other tanh GELU's name.
  EXPECT_EQ(nn::parse_hf_gpt2_config(transformers_config("\"n_ctx\": 16,"), "c").block_size, 16);
  EXPECT_EQ(nn::parse_hf_gpt2_config(transformers_config("\"n_ctx\": 24,", false), "c").block_size,
            24);
  std::string tanh = transformers_config();
  tanh.replace(tanh.find("\"gelu_new\""), 10, "\"gelu_pytorch_tanh\"");
  EXPECT_EQ(nn::parse_hf_gpt2_config(tanh, "c").n_layer, 2);
}

TEST(GPT2HFConfig, what_accrue_cannot_be_is_refused_naming_the_key) {
  auto refused = [](const std::string& text) {
    try {
      nn::parse_hf_gpt2_config(text, "dir/config.json");
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("accepted");
  };
  using ::testing::HasSubstr;
  std::string llama = transformers_config();
  llama.replace(llama.find("\"gpt2\""), 6, "\"llama\"");
  EXPECT_THAT(refused(llama), HasSubstr("model_type 'llama' is not a GPT-2 config"));
  std::string relu = transformers_config();
  relu.replace(relu.find("\"gelu_new\""), 10, "\"relu\"");
  EXPECT_THAT(refused(relu), HasSubstr("'activation_function' is 'relu'"));
  std::string inner = transformers_config();
  inner.replace(inner.find("\"n_inner\": null"), 15, "\"n_inner\": 100");
  EXPECT_THAT(refused(inner), HasSubstr("'n_inner' 100 is not 4 * n_embd = 128"));
  std::string unscaled = transformers_config();
  unscaled.replace(unscaled.find("\"scale_attn_weights\": true"), 26,
                   "\"scale_attn_weights\": false");
  EXPECT_THAT(refused(unscaled), HasSubstr("'scale_attn_weights' is false"));
  std::string by_layer = transformers_config();
  by_layer.replace(by_layer.find("\"scale_attn_by_inverse_layer_idx\": false"), 40,
                   "\"scale_attn_by_inverse_layer_idx\": true");
  EXPECT_THAT(refused(by_layer), HasSubstr("'scale_attn_by_inverse_layer_idx' is true"));
  EXPECT_THAT(refused(transformers_config("\"tie_word_embeddings\": false,")),
              HasSubstr("'tie_word_embeddings' is false"));
  EXPECT_THAT(refused(transformers_config("\"add_cross_attention\": true,")),
              HasSubstr("cross-attention"));
  EXPECT_THAT(refused(transformers_config("\"quantization_config\": {},")),
              HasSubstr("quantized checkpoints"));
  EXPECT_THAT(refused(transformers_config("\"n_ctx\": 32,")),
              HasSubstr("'n_positions' 16 and 'n_ctx' 32 differ"));
  EXPECT_THAT(refused(transformers_config("", false)),
              HasSubstr("neither 'n_positions' nor 'n_ctx'"));
  EXPECT_THAT(refused(transformers_config("\"n_layer\": 3,")),
              HasSubstr("duplicate key 'n_layer'"));
  std::string no_head = transformers_config();
  no_head.replace(no_head.find("\"n_head\": 4,"), 12, "");
  EXPECT_THAT(refused(no_head), HasSubstr("the config has no 'n_head'"));
  std::string odd = transformers_config();
  odd.replace(odd.find("\"n_head\": 4"), 11, "\"n_head\": 5");
  EXPECT_THAT(refused(odd), HasSubstr("dir/config.json"));
  EXPECT_THAT(refused(odd), HasSubstr("multiple of n_head 5"));
  EXPECT_THAT(refused("[1, 2]"), HasSubstr("must be a JSON object"));
}

// A directory as save_pretrained leaves it: config.json and model.safetensors.
TEST(GPT2HFConfig, gpt2_from_hf_builds_the_config_and_loads_the_weights) {
  const auto a = make_gpt2(hf_config(), 11);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "accrue_gpt2_hf_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nn::save_hf_gpt2(*a, (dir / "model.safetensors").string());
  {
    std::ofstream config(dir / "config.json");
    config << transformers_config();
  }
  Generator gen(1);
  const std::unique_ptr<nn::GPT2> b =
      nn::gpt2_from_hf(dir.string(), {Device::cpu(), DType::f64, &gen}, true);
  EXPECT_TRUE(b->config().activation_checkpointing);
  EXPECT_EQ(b->config().block_size, 16);
  expect_same_parameters(*a, *b);
  const Tensor idx = tokens(2, 16, 120, 4);
  EXPECT_TRUE(test::all_equal(detach(b->logits(idx)), detach(a->logits(idx))));
  std::filesystem::remove(dir / "model.safetensors");
  EXPECT_ERROR(nn::gpt2_from_hf(dir.string(), {Device::cpu(), DType::f64, &gen}),
               "model.safetensors");
  std::filesystem::remove_all(dir);
  EXPECT_ERROR(nn::gpt2_from_hf(dir.string(), {Device::cpu(), DType::f64, &gen}),
               "read_hf_gpt2_config", "config.json");
}

}  // namespace
}  // namespace accrue
