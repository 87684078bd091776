// Hugging Face GPT-2 safetensors <-> nn::GPT2: names, Conv1D layouts, the
// padded vocabulary, ignored buffers, tied lm_head, errors, and loading into
// a model an optim::ParamStore already holds (Note [One load path]).
#include "accrue/nn/gpt2_hf.h"

#include <gmock/gmock.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/core/tensor_io.h"
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

}  // namespace
}  // namespace accrue
