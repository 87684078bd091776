// nn::GPT2 on the CPU: configuration, parameter layout and initialization,
// forward and loss, the float64 gradcheck of the whole model, activation
// checkpointing (bitwise-equal gradients), and accumulation in a GradArena +
// Window equal to the large batch.
#include "accrue/nn/gpt2.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// The tiny GPT-2 of the tests: 2 layers, 4 heads, width 64, vocabulary 128
// padded to 256, sequences up to 32.
nn::GPT2Config tiny_config() {
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 128;
  c.padded_vocab_size = 256;
  return c;
}

// Small enough for a finite-difference gradcheck of whole parameter tensors.
nn::GPT2Config micro_config() {
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 6;
  c.vocab_size = 11;
  c.padded_vocab_size = 16;
  return c;
}

std::unique_ptr<nn::GPT2> make_gpt2(const nn::GPT2Config& config, uint64_t seed,
                                    DType dtype = DType::f64) {
  Generator gen(seed);
  return std::make_unique<nn::GPT2>(config, nn::ParamOptions{Device::cpu(), dtype, &gen});
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return randint(0, vocab, {B, T}, DType::i64, Device::cpu(), &gen);
}

const Tensor& param(const nn::Module& m, const std::string& name) {
  static Tensor none;
  for (const nn::NamedParameter& p : m.named_parameters())
    if (p.name == name) return p.tensor;
  ADD_FAILURE() << "no parameter " << name;
  return none;
}

double sample_std(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  double s = 0, s2 = 0;
  for (double x : v) {
    s += x;
    s2 += x * x;
  }
  const double n = static_cast<double>(v.size()), mean = s / n;
  return std::sqrt(s2 / n - mean * mean);
}

// ---- configuration ----------------------------------------------------------------------------

TEST(GPT2Config, presets_and_names) {
  const nn::GPT2Config d12 = nn::GPT2Config::d12();
  EXPECT_EQ(d12.n_layer, 12);
  EXPECT_EQ(d12.n_head, 12);
  EXPECT_EQ(d12.n_embd, 768);
  EXPECT_EQ(d12.block_size, 1024);
  EXPECT_EQ(d12.vocab_size, 50257);
  EXPECT_EQ(d12.padded_vocab(), 50304);
  EXPECT_EQ(d12.dropout, 0.0);
  EXPECT_EQ(d12.layer_norm_eps, 1e-5);
  EXPECT_TRUE(d12.bias);
  EXPECT_FALSE(d12.activation_checkpointing);
  const nn::GPT2Config d24 = nn::GPT2Config::d24(), d36 = nn::GPT2Config::d36(),
                       d48 = nn::GPT2Config::d48();
  EXPECT_EQ((std::vector<int64_t>{d24.n_layer, d24.n_head, d24.n_embd}),
            (std::vector<int64_t>{24, 16, 1024}));
  EXPECT_EQ((std::vector<int64_t>{d36.n_layer, d36.n_head, d36.n_embd}),
            (std::vector<int64_t>{36, 20, 1280}));
  EXPECT_EQ((std::vector<int64_t>{d48.n_layer, d48.n_head, d48.n_embd}),
            (std::vector<int64_t>{48, 25, 1600}));
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"d12", "gpt2"}, {"d24", "gpt2-medium"}, {"d36", "gpt2-large"}, {"d48", "gpt2-xl"}}) {
    EXPECT_EQ(nn::GPT2Config::from_name(a).n_embd, nn::GPT2Config::from_name(b).n_embd) << a;
  }
  EXPECT_EQ(nn::GPT2Config::from_name("gpt2-xl").n_layer, 48);
  EXPECT_ERROR(nn::GPT2Config::from_name("gpt3"), "from_name", "'gpt3'", "d12", "gpt2-xl");
}

TEST(GPT2Config, parameter_counts) {
  // Hugging Face's GPT-2 (vocabulary 50257) has 124,439,808 parameters; the
  // 47 padded rows of wte add 47 * 768.
  nn::GPT2Config hf = nn::GPT2Config::d12();
  hf.padded_vocab_size = 50257;
  EXPECT_EQ(hf.parameter_count(), 124439808);
  EXPECT_EQ(nn::GPT2Config::d12().parameter_count(), 124439808 + 47 * 768);
  std::printf(
      "[gpt2] parameters with the padded vocabulary 50304: d12 %lld, d24 %lld, d36 %lld, "
      "d48 %lld\n",
      static_cast<long long>(nn::GPT2Config::d12().parameter_count()),
      static_cast<long long>(nn::GPT2Config::d24().parameter_count()),
      static_cast<long long>(nn::GPT2Config::d36().parameter_count()),
      static_cast<long long>(nn::GPT2Config::d48().parameter_count()));
  // HF gpt2-medium: 354,823,168 parameters with vocabulary 50257.
  nn::GPT2Config medium = nn::GPT2Config::d24();
  medium.padded_vocab_size = 50257;
  EXPECT_EQ(medium.parameter_count(), 354823168);
}

TEST(GPT2Config, invalid_configurations_name_their_values) {
  nn::GPT2Config c = tiny_config();
  c.n_embd = 10;
  c.n_head = 3;
  EXPECT_ERROR(c.validate(), "GPT2Config", "n_embd 10", "n_head 3");
  EXPECT_ERROR((void)std::make_unique<nn::GPT2>(c, nn::ParamOptions{}), "n_embd 10");
  c = tiny_config();
  c.padded_vocab_size = 100;
  EXPECT_ERROR(c.validate(), "padded_vocab_size 100", "vocab_size 128");
  c = tiny_config();
  c.dropout = 1.0;
  EXPECT_ERROR(c.validate(), "dropout 1");
  c = tiny_config();
  c.n_layer = 0;
  EXPECT_ERROR(c.validate(), "n_layer", "0");
  c = tiny_config();
  c.block_size = -1;
  EXPECT_ERROR(c.validate(), "block_size", "-1");
  c = tiny_config();
  c.layer_norm_eps = 0.0;
  EXPECT_ERROR(c.validate(), "layer_norm_eps");
  c = tiny_config();
  c.padded_vocab_size = 0;
  EXPECT_EQ(c.padded_vocab(), 128);
  c.vocab_size = 129;
  EXPECT_EQ(c.padded_vocab(), 256);
}

// ---- parameters ---------------------------------------------------------------------------------

TEST(GPT2, parameters_in_order_with_names_and_shapes) {
  const nn::GPT2Config c = tiny_config();
  const auto model = make_gpt2(c, 1, DType::f32);
  const int64_t C = 64;
  std::vector<std::pair<std::string, Shape>> expected = {{"wte", {256, C}}, {"wpe", {32, C}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const auto& e :
         std::vector<std::pair<std::string, Shape>>{{"ln_1.weight", {C}},
                                                    {"ln_1.bias", {C}},
                                                    {"attn.c_attn.weight", {3 * C, C}},
                                                    {"attn.c_attn.bias", {3 * C}},
                                                    {"attn.c_proj.weight", {C, C}},
                                                    {"attn.c_proj.bias", {C}},
                                                    {"ln_2.weight", {C}},
                                                    {"ln_2.bias", {C}},
                                                    {"mlp.c_fc.weight", {4 * C, C}},
                                                    {"mlp.c_fc.bias", {4 * C}},
                                                    {"mlp.c_proj.weight", {C, 4 * C}},
                                                    {"mlp.c_proj.bias", {C}}})
      expected.push_back({h + e.first, e.second});
  }
  expected.push_back({"ln_f.weight", {C}});
  expected.push_back({"ln_f.bias", {C}});
  const std::vector<nn::NamedParameter> params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  int64_t count = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, expected[i].first) << i;
    EXPECT_EQ(params[i].tensor.shape(), expected[i].second) << params[i].name;
    EXPECT_TRUE(params[i].tensor.requires_grad()) << params[i].name;
    EXPECT_EQ(params[i].tensor.dtype(), DType::f32) << params[i].name;
    count += params[i].tensor.numel();
  }
  EXPECT_EQ(model->parameter_count(), count);
  EXPECT_EQ(c.parameter_count(), count);
  // Tied: the output layer is wte itself, registered once.
  EXPECT_TRUE(params[0].tensor.is_same(model->wte()));
  EXPECT_EQ(params[1].name, "wpe");

  nn::GPT2Config nb = tiny_config();
  nb.bias = false;
  const auto no_bias = make_gpt2(nb, 1, DType::f32);
  EXPECT_EQ(no_bias->parameter_count(), nb.parameter_count());
  for (const nn::NamedParameter& p : no_bias->named_parameters())
    EXPECT_EQ(p.name.find("bias"), std::string::npos) << p.name;
}

TEST(GPT2, initialization_follows_gpt2) {
  nn::GPT2Config c = tiny_config();
  c.n_layer = 8;  // residual std 0.02 / sqrt(16) = 0.005
  const auto model = make_gpt2(c, 2);
  for (const nn::NamedParameter& p : model->named_parameters()) {
    const std::string& n = p.name;
    const auto ends_with = [&](const std::string& s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with(".bias")) {
      EXPECT_TRUE(test::all_equal(p.tensor, zeros(p.tensor.shape(), DType::f64))) << n;
    } else if (n.find("ln_") != std::string::npos) {
      EXPECT_TRUE(test::all_equal(p.tensor, ones(p.tensor.shape(), DType::f64))) << n;
    } else if (ends_with("c_proj.weight")) {
      EXPECT_NEAR(sample_std(p.tensor), 0.005, 0.0005) << n;
    } else if (n == "wte") {
      NoGradGuard no_grad;
      EXPECT_NEAR(sample_std(p.tensor.narrow(0, 0, 128)), 0.02, 0.001) << n;
      // The padded rows are never a target; they start (and stay) at zero.
      EXPECT_TRUE(test::all_equal(p.tensor.narrow(0, 128, 128), zeros({128, 64}, DType::f64)));
    } else {
      EXPECT_NEAR(sample_std(p.tensor), 0.02, 0.002) << n;
    }
  }
  // The same seed gives the same model, in any dtype (drawn in f64, then cast).
  const auto again = make_gpt2(c, 2), in_f32 = make_gpt2(c, 2, DType::f32), other = make_gpt2(c, 3);
  const auto a = model->parameters(), b = again->parameters(), f = in_f32->parameters(),
             o = other->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(test::all_equal(a[i], b[i])) << i;
    EXPECT_TRUE(test::all_equal(f[i], detach(a[i]).to(DType::f32))) << i;
  }
  EXPECT_FALSE(test::all_equal(o[0], a[0]));
}

// ---- forward and loss ---------------------------------------------------------------------------

TEST(GPT2, forward_loss_and_backward_on_the_tiny_model) {
  const nn::GPT2Config c = tiny_config();
  const auto model = make_gpt2(c, 3);
  const Tensor idx = tokens(4, 32, c.vocab_size, 10), targets = tokens(4, 32, c.vocab_size, 11);
  const Tensor h = model->forward(idx);
  EXPECT_EQ(h.shape(), (Shape{4, 32, 64}));
  const Loss loss = model->loss(idx, targets);
  EXPECT_EQ(loss.count.item(), 4 * 32);
  // Small initial weights: the logits are near 0, the loss near log(vocab).
  const double mean_loss = loss.sum.item() / loss.count.item();
  std::printf("[gpt2] tiny model at init: loss %.4f, log(vocab) %.4f\n", mean_loss,
              std::log(128.0));
  EXPECT_NEAR(mean_loss, std::log(128.0), 0.05);

  backward(loss.sum);
  for (const nn::NamedParameter& p : model->named_parameters()) {
    ASSERT_TRUE(grad(p.tensor).defined()) << p.name;
    EXPECT_GT(sample_std(grad(p.tensor)), 0.0) << p.name;
  }
  // Padded rows take no part: neither embedded (ids < vocab) nor in the softmax.
  NoGradGuard no_grad;
  EXPECT_TRUE(
      test::all_equal(grad(model->wte()).narrow(0, 128, 128), zeros({128, 64}, DType::f64)));
}

TEST(GPT2, logits_agree_with_the_fused_classifier_loss) {
  const nn::GPT2Config c = tiny_config();
  const auto model = make_gpt2(c, 4);
  const Tensor idx = tokens(2, 9, c.vocab_size, 12);
  Tensor targets = tokens(2, 9, c.vocab_size, 13);
  targets.data<int64_t>()[3] = -100;  // ignored
  NoGradGuard no_grad;
  const Tensor logits = model->logits(idx);
  EXPECT_EQ(logits.shape(), (Shape{2, 9, 128}));
  const Loss fused = model->loss(idx, targets);
  const Loss plain = cross_entropy(logits.reshape({18, 128}), targets.reshape({18}));
  EXPECT_EQ(fused.count.item(), 17);
  EXPECT_EQ(plain.count.item(), 17);
  EXPECT_NEAR(fused.sum.item(), plain.sum.item(), 1e-11 * std::fabs(plain.sum.item()));
}

TEST(GPT2, shorter_sequences_use_the_first_positions) {
  const nn::GPT2Config c = tiny_config();
  const auto model = make_gpt2(c, 5);
  model->eval();
  const Tensor idx = tokens(2, 12, c.vocab_size, 14);
  NoGradGuard no_grad;
  // Causal: the first 5 positions of a 12-token forward are a 5-token forward.
  const Tensor full_h = model->forward(idx);
  const Tensor short_h = model->forward(idx.narrow(1, 0, 5).contiguous());
  EXPECT_TRUE(test::all_close(full_h.narrow(1, 0, 5), short_h, 1e-12, 1e-12));
}

TEST(GPT2, bad_inputs_are_errors) {
  const nn::GPT2Config c = tiny_config();
  const auto model = make_gpt2(c, 6);
  const Tensor idx = tokens(2, 8, c.vocab_size, 15);
  EXPECT_ERROR(model->forward(idx.reshape({16})), "GPT2::forward", "[B, T]", "[16]");
  EXPECT_ERROR(model->forward(idx.to(DType::f32)), "GPT2::forward", "f32", "i32 or i64");
  EXPECT_ERROR(model->forward(tokens(1, 33, c.vocab_size, 16)), "GPT2::forward", "T = 33",
               "block_size = 32");
  EXPECT_ERROR(model->loss(idx, tokens(2, 7, c.vocab_size, 17)), "GPT2::loss", "[2, 7]", "[2, 8]");
  EXPECT_THROW(model->forward(full({1, 4}, 256.0, DType::i64)), Error);    // id past wte's rows
  EXPECT_THROW(model->loss(idx, full({2, 8}, 128.0, DType::i64)), Error);  // target past vocab
  // i32 ids work as i64 ones.
  NoGradGuard no_grad;
  EXPECT_TRUE(test::all_equal(model->forward(idx.to(DType::i32)), model->forward(idx)));
}

TEST(GPT2, eval_turns_dropout_off_and_train_back_on) {
  nn::GPT2Config c = tiny_config();
  c.dropout = 0.2;
  const auto model = make_gpt2(c, 7);
  c.dropout = 0.0;
  const auto no_dropout = make_gpt2(c, 7);
  const Tensor idx = tokens(2, 16, c.vocab_size, 18);
  NoGradGuard no_grad;
  EXPECT_TRUE(model->training());
  EXPECT_TRUE(model->block(1).attn().training());
  const Tensor train_a = model->forward(idx), train_b = model->forward(idx);
  EXPECT_FALSE(test::all_equal(train_a, train_b));  // fresh masks each forward
  model->eval();
  EXPECT_FALSE(model->block(1).mlp().training());
  const uint64_t offset = model->dropout_generator().offset();
  EXPECT_TRUE(test::all_equal(model->forward(idx), no_dropout->forward(idx)));
  EXPECT_EQ(model->dropout_generator().offset(), offset);  // nothing drawn
  model->train();
  EXPECT_TRUE(model->block(0).attn().training());
  EXPECT_FALSE(test::all_equal(model->forward(idx), no_dropout->forward(idx)));
}

// ---- gradients ----------------------------------------------------------------------------------

// The float64 finite-difference check of the loss w.r.t. whole parameter tensors.
void gradcheck_model(const nn::GPT2Config& c,
                     const std::vector<std::string>& names = {
                         "wte", "wpe", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                         "h.0.attn.c_proj.bias", "h.1.ln_2.bias", "h.1.mlp.c_fc.weight",
                         "h.1.mlp.c_proj.weight", "ln_f.weight", "ln_f.bias"}) {
  const auto model = make_gpt2(c, 8);
  const Tensor idx = tokens(2, 5, c.vocab_size, 19);
  Tensor targets = tokens(2, 5, c.vocab_size, 20);
  targets.data<int64_t>()[7] = -100;
  std::vector<Tensor> checked;
  for (const std::string& name : names)
    checked.push_back(param(*model, name));
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>&) {
        // Every evaluation draws the same dropout masks.
        model->dropout_generator().set_state(c.dropout_seed, 0);
        return model->loss(idx, targets).sum;
      },
      checked);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(GPT2, whole_model_passes_the_float64_gradcheck) {
  gradcheck_model(micro_config());
}

TEST(GPT2, whole_model_with_dropout_and_checkpointing_passes_the_gradcheck) {
  nn::GPT2Config c = micro_config();
  c.dropout = 0.1;
  c.activation_checkpointing = true;
  c.dropout_seed = 42;
  gradcheck_model(c);
}

TEST(GPT2, without_biases_the_model_passes_the_gradcheck) {
  nn::GPT2Config c = micro_config();
  c.bias = false;
  gradcheck_model(c, {"wte", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.weight",
                      "h.1.mlp.c_proj.weight", "ln_f.weight"});
}

// Loss and every gradient of one backward, as host values.
struct Result {
  std::vector<double> loss;
  std::vector<Tensor> grads;
  uint64_t generator_offset = 0;
};

Result train_step(const nn::GPT2Config& c, const Tensor& idx, const Tensor& targets) {
  const auto model = make_gpt2(c, 9);
  Result r;
  for (int step = 0; step < 2; ++step) {  // two backwards: the generator moves on in between
    const Loss loss = model->loss(idx, targets);
    r.loss.push_back(loss.sum.item());
    backward(loss.sum);
  }
  for (const Tensor& p : model->parameters())
    r.grads.push_back(grad(p));
  r.generator_offset = model->dropout_generator().offset();
  return r;
}

TEST(GPT2, activation_checkpointing_gives_bitwise_equal_gradients) {
  for (double p : {0.0, 0.1}) {
    nn::GPT2Config c = tiny_config();
    c.dropout = p;
    c.dropout_seed = 77;
    const Tensor idx = tokens(3, 24, c.vocab_size, 21), targets = tokens(3, 24, c.vocab_size, 22);
    const Result plain = train_step(c, idx, targets);
    c.activation_checkpointing = true;
    {
      // Every block is a checkpoint: the hidden state comes out of the last one.
      const auto model = make_gpt2(c, 9);
      EXPECT_STREQ(grad_fn(model->forward(idx))->name(), "CheckpointOutput");
    }
    const Result ckpt = train_step(c, idx, targets);
    EXPECT_EQ(ckpt.loss, plain.loss) << "dropout " << p;
    EXPECT_EQ(ckpt.generator_offset, plain.generator_offset) << "dropout " << p;
    if (p > 0) {
      EXPECT_GT(plain.generator_offset, 0u);
    }
    ASSERT_EQ(ckpt.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i)
      EXPECT_TRUE(test::all_equal(ckpt.grads[i], plain.grads[i]))
          << "dropout " << p << " param " << i;
  }
}

// ---- accumulation -------------------------------------------------------------------------------

std::unique_ptr<optim::ParamStore> arena_for(const nn::GPT2& model) {
  return std::make_unique<optim::ParamStore>(model.named_parameters(),
                                             optim::ParamStoreOptions().master_dtype(DType::f64));
}

std::vector<double> slot_values(const optim::ParamStore& arena, const Tensor& flat, size_t i) {
  const optim::ParamStore::Slot& s = arena.slots()[i];
  return flat.narrow(0, s.offset, s.numel).to_vector<double>();
}

// max_i |a_i - b_i| / max_i |b_i|: Note [Grad arena]'s per-slot measure.
double slot_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

TEST(GPT2, accumulated_micro_batches_equal_the_large_batch_in_an_arena) {
  nn::GPT2Config c = tiny_config();
  constexpr int64_t kBatch = 8, kSeq = 16;
  const Tensor idx = tokens(kBatch, kSeq, c.vocab_size, 23);
  Tensor targets = tokens(kBatch, kSeq, c.vocab_size, 24);
  for (int64_t i = 0; i < kBatch * kSeq; i += 7)
    targets.data<int64_t>()[i] = -100;  // uneven counts across micro-batches

  struct Run {
    std::unique_ptr<nn::GPT2> model;
    std::unique_ptr<optim::ParamStore> arena;
    std::unique_ptr<optim::Optimizer> opt;
    std::unique_ptr<optim::Window> window;
  };
  auto run = [&](int64_t K, bool checkpointing) {
    nn::GPT2Config rc = c;
    rc.activation_checkpointing = checkpointing;
    Run r;
    r.model = make_gpt2(rc, 10);
    r.arena = arena_for(*r.model);
    EXPECT_EQ(r.arena->size(), r.model->named_parameters().size());
    r.opt = std::make_unique<optim::Optimizer>(optim::AdamWOptions(1e-3).weight_decay(0.1));
    r.window = std::make_unique<optim::Window>(
        *r.arena, *r.opt, optim::WindowOptions().micro_steps(K).max_grad_norm(1.0));
    const int64_t b = kBatch / K;
    for (int64_t k = 0; k < K; ++k) {
      r.window->backward(r.model->loss(idx.narrow(0, k * b, b).contiguous(),
                                       targets.narrow(0, k * b, b).contiguous()));
    }
    return r;
  };
  Run full = run(1, false);
  for (auto [K, checkpointing] : std::vector<std::pair<int64_t, bool>>{{4, false}, {8, true}}) {
    Run micro = run(K, checkpointing);
    // The raw summed gradient (Note [Overwrite first]), slot by slot.
    double worst = 0;
    for (size_t i = 0; i < full.arena->size(); ++i) {
      worst = std::max(worst, slot_error(slot_values(*micro.arena, micro.arena->grads(), i),
                                         slot_values(*full.arena, full.arena->grads(), i)));
    }
    std::printf("[gpt2] K=%lld%s vs K=1: gradients max per-slot relative error %.3g\n",
                static_cast<long long>(K), checkpointing ? " (checkpointed)" : "", worst);
    EXPECT_LE(worst, 1e-12) << "K=" << K;
    micro.window->close();
    if (K == 4) full.window->close();
    EXPECT_NEAR(micro.window->report().loss, full.window->report().loss,
                1e-12 * full.window->report().loss);
    double params = 0;
    for (size_t i = 0; i < full.arena->size(); ++i) {
      params = std::max(params, slot_error(slot_values(*micro.arena, micro.arena->master(), i),
                                           slot_values(*full.arena, full.arena->master(), i)));
    }
    EXPECT_LE(params, 1e-10) << "K=" << K;  // after one AdamW step
  }
}

TEST(GPT2, bf16_compute_copy_in_an_arena_is_close_to_f32_and_checkpoints_bitwise) {
  const nn::GPT2Config c = tiny_config();
  const Tensor idx = tokens(2, 16, c.vocab_size, 25), targets = tokens(2, 16, c.vocab_size, 26);
  // One backward in an arena of f32 master weights computing in `compute`.
  auto run = [&](DType compute, bool checkpointing) {
    nn::GPT2Config rc = c;
    rc.activation_checkpointing = checkpointing;
    const auto model = make_gpt2(rc, 11, DType::f32);
    std::vector<Tensor> params = model->parameters();
    optim::ParamStore arena(params, optim::ParamStoreOptions().compute_dtype(compute).moments(0));
    EXPECT_EQ(model->wte().dtype(), compute);  // one slot for both uses of the tied table
    arena.begin_window();
    const Loss loss = model->loss(idx, targets);
    backward(loss.sum);
    EXPECT_EQ(arena.zero_unwritten(), 0);
    return std::make_pair(loss.sum.item(), arena.grads().clone());
  };
  const auto f32 = run(DType::f32, false), bf16 = run(DType::bf16, false),
             bf16_ckpt = run(DType::bf16, true);
  std::printf("[gpt2] loss f32 %.6f, bf16 compute copy %.6f; bf16 gradients vs f32 %.3g\n",
              f32.first, bf16.first, test::relative_error(bf16.second, f32.second));
  EXPECT_NEAR(bf16.first, f32.first, 1e-2 * std::fabs(f32.first));
  EXPECT_LT(test::relative_error(bf16.second, f32.second), 0.1);
  EXPECT_EQ(bf16_ckpt.first, bf16.first);
  EXPECT_TRUE(test::all_equal(bf16_ckpt.second, bf16.second));
}

}  // namespace
}  // namespace accrue
