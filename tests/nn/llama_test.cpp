// nn::Llama on the CPU: names and shapes as transformers', the tied head, Qwen3's
// QK-norm, the fused classifier against logits + cross_entropy, checkpointing,
// right-padded and packed batches against each sequence alone, the
// initialization, loading a transformers-written directory, and bad inputs.
// Training against transformers itself is tests/golden/llama_hf_golden_test.cpp.
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/nn/llama.h"
#include "accrue/nn/llama_hf.h"
#include "accrue/optim/param_store.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

Tensor tokens(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  std::vector<int64_t> v(static_cast<size_t>(B * T));
  for (int64_t& x : v)
    x = d(rng);
  return from_vector<int64_t>(v, {B, T});
}

std::unique_ptr<nn::Llama> make(const nn::LlamaConfig& c, uint64_t seed, DType dtype = DType::f64) {
  Generator gen(seed);
  return std::make_unique<nn::Llama>(c, nn::ParamOptions{Device::cpu(), dtype, &gen});
}

// Norms start at one: perturb them so that a test sees them act.
void perturb_norms(nn::Llama& model, uint32_t seed) {
  NoGradGuard no_grad;
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(1.0, 0.2);
  for (const nn::NamedParameter& p : model.named_parameters()) {
    if (p.tensor.dim() != 1) continue;
    std::vector<double> v(static_cast<size_t>(p.tensor.numel()));
    for (double& x : v)
      x = d(rng);
    p.tensor.copy_(from_vector<double>(v, p.tensor.shape(), p.tensor.dtype()));
  }
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = detach(a).to(DType::f64).contiguous().to_vector<double>(),
                            y = detach(b).to(DType::f64).contiguous().to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<Tensor> grads_of(const nn::Llama& model) {
  std::vector<Tensor> g;
  for (const Tensor& p : model.parameters())
    g.push_back(grad(p));
  return g;
}

nn::LlamaConfig small(bool qwen3) {
  nn::LlamaConfig c = qwen3 ? nn::LlamaConfig::qwen3_tiny() : nn::LlamaConfig::llama_tiny();
  c.vocab_size = 96;
  return c;
}

TEST(Llama, parameters_carry_transformers_names_shapes_and_order) {
  for (const char* name : {"llama-tiny", "qwen3-tiny"}) {
    nn::LlamaConfig c = nn::LlamaConfig::from_name(name);
    for (bool bias : {false, true}) {
      c.attention_bias = bias;
      const auto model = make(c, 1, DType::f32);
      const std::vector<nn::HFLlamaTensor> hf = nn::hf_llama_tensors(c);
      const std::vector<nn::NamedParameter> params = model->named_parameters();
      std::vector<nn::HFLlamaTensor> expected;
      for (const nn::HFLlamaTensor& t : hf)
        if (!(c.tie_word_embeddings && t.name == "lm_head.weight")) expected.push_back(t);
      ASSERT_EQ(params.size(), expected.size()) << name;
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].name, expected[i].name) << name << " " << i;
        EXPECT_EQ(params[i].tensor.shape(), expected[i].shape) << params[i].name;
      }
      EXPECT_EQ(model->parameter_count(), c.parameter_count()) << name;
      EXPECT_TRUE(model->named_buffers().size() == 1 && model->state_dict().size() == params.size())
          << "the positions buffer is not state";
    }
  }
}

TEST(Llama, forward_and_logits_shapes) {
  const nn::LlamaConfig c = small(true);
  const auto model = make(c, 2, DType::f32);
  const Tensor idx = tokens(3, 10, c.vocab_size, 1);
  EXPECT_EQ(model->forward(idx).shape(), (Shape{3, 10, c.hidden}));
  EXPECT_EQ(model->logits(idx).shape(), (Shape{3, 10, c.vocab_size}));
  const Loss l = model->loss(idx, tokens(3, 10, c.vocab_size, 2));
  EXPECT_EQ(l.count.item(), 30.0);
  EXPECT_TRUE(std::isfinite(l.sum.item()));
  EXPECT_NEAR(l.sum.item() / 30.0, std::log(static_cast<double>(c.vocab_size)), 0.1)
      << "a fresh model predicts about uniformly";
}

TEST(Llama, qk_norm_only_for_qwen3) {
  for (bool qwen3 : {false, true}) {
    const auto model = make(small(qwen3), 3, DType::f32);
    int q = 0, k = 0;
    for (const nn::NamedParameter& p : model->named_parameters()) {
      q += p.name.find("self_attn.q_norm.weight") != std::string::npos;
      k += p.name.find("self_attn.k_norm.weight") != std::string::npos;
    }
    EXPECT_EQ(q, qwen3 ? 2 : 0);
    EXPECT_EQ(k, qwen3 ? 2 : 0);
    EXPECT_EQ(model->layer(1).self_attn().q_norm() != nullptr, qwen3);
    EXPECT_EQ(model->layer(0).self_attn().k_norm() != nullptr, qwen3);
    EXPECT_ERROR(model->layer(2), "Llama::layer", "index 2", "2 layers");
  }
}

TEST(Llama, tied_head_shares_the_embedding_and_gets_both_gradients) {
  nn::LlamaConfig c = small(false);
  c.tie_word_embeddings = true;
  const auto tied = make(c, 4);
  perturb_norms(*tied, 1);
  EXPECT_TRUE(tied->head_weight().is_same(tied->embed_tokens()));
  EXPECT_EQ(tied->head_weight().data_ptr(), tied->embed_tokens().data_ptr());
  // The same model untied, its lm_head a copy of the embedding.
  nn::LlamaConfig u = c;
  u.tie_word_embeddings = false;
  const auto untied = make(u, 5);
  std::map<std::string, Tensor> state = tied->state_dict();
  state["lm_head.weight"] = state.at("model.embed_tokens.weight").clone();
  untied->load_state_dict(state);
  EXPECT_FALSE(untied->head_weight().is_same(untied->embed_tokens()));

  const Tensor idx = tokens(2, 12, c.vocab_size, 3), targets = tokens(2, 12, c.vocab_size, 4);
  const Loss a = tied->loss(idx, targets), b = untied->loss(idx, targets);
  EXPECT_EQ(a.sum.item(), b.sum.item());
  backward(a.sum);
  backward(b.sum);
  const Tensor both = grad(untied->embed_tokens()) + grad(untied->head_weight());
  EXPECT_GT(max_rel(grad(untied->head_weight()), both), 0.1) << "the head's part is not small";
  EXPECT_LE(max_rel(grad(tied->embed_tokens()), both), 1e-14);
}

TEST(Llama, fused_classifier_equals_logits_and_cross_entropy_in_f64) {
  for (bool qwen3 : {false, true}) {
    const nn::LlamaConfig c = small(qwen3);
    const auto fused = make(c, 6), composed = make(c, 6);
    perturb_norms(*fused, 2);
    composed->load_state_dict(fused->state_dict());
    const Tensor idx = tokens(3, 9, c.vocab_size, 5);
    std::vector<int64_t> t = tokens(3, 9, c.vocab_size, 6).to_vector<int64_t>();
    t[4] = t[10] = t[26] = -100;
    const Tensor targets = from_vector<int64_t>(t, {3, 9});
    const std::vector<int64_t> lens = {9, 6, 8};
    const auto layout = nn::BatchLayout::padded(lens, Device::cpu());
    const Loss a = fused->loss(idx, targets, layout);
    const Loss b = cross_entropy(reshape(composed->logits(idx, layout), {27, c.vocab_size}),
                                 reshape(targets, {27}));
    EXPECT_EQ(a.count.item(), 24.0);
    EXPECT_EQ(b.count.item(), 24.0);
    EXPECT_LE(std::fabs(a.sum.item() - b.sum.item()) / b.sum.item(), 1e-14);
    backward(a.sum);
    backward(b.sum);
    const std::vector<Tensor> ga = grads_of(*fused), gb = grads_of(*composed);
    for (size_t i = 0; i < ga.size(); ++i)
      EXPECT_LE(max_rel(ga[i], gb[i]), 1e-12) << fused->named_parameters()[i].name;
  }
}

// The float64 finite-difference check of the loss w.r.t. every parameter
// of a micro Qwen3 (biases, QK-norm, head_dim apart from hidden / heads,
// tied head) and a micro Llama (llama3 scaling, checkpointing), on padded
// and packed layouts.
TEST(Llama, whole_model_passes_the_float64_gradcheck) {
  for (bool qwen3 : {false, true}) {
    nn::LlamaConfig c = small(qwen3);
    c.vocab_size = 11;
    c.hidden = 8;
    c.intermediate = 12;
    c.heads = 2;
    c.kv_heads = 1;
    c.head_dim = qwen3 ? 6 : 4;
    c.attention_bias = qwen3;
    c.activation_checkpointing = !qwen3;
    if (!qwen3) c.rope_scaling = {nn::RopeScaling::Type::llama3, 4.0, 1.0, 4.0, 8};
    const auto model = make(c, 16);
    perturb_norms(*model, 5);
    {
      // Biases start at zero: move them so that their products count.
      NoGradGuard no_grad;
      for (const nn::NamedParameter& p : model->named_parameters())
        if (p.name.find("bias") != std::string::npos)
          p.tensor.copy_(test::random_normal(p.tensor.shape(), DType::f64) * 0.1);
    }
    const Tensor idx = tokens(2, 5, c.vocab_size, 15);
    Tensor targets = tokens(2, 5, c.vocab_size, 16);
    targets.data<int64_t>()[8] = -100;
    const nn::BatchLayout layout =
        qwen3 ? nn::BatchLayout::packed_documents({3, 4, 3}, 2, 5, Device::cpu())
              : nn::BatchLayout::padded({5, 4}, Device::cpu());
    const GradcheckResult r =
        gradcheck([&](const std::vector<Tensor>&) { return model->loss(idx, targets, layout).sum; },
                  model->parameters());
    EXPECT_TRUE(r.ok) << (qwen3 ? "qwen3: " : "llama: ") << r.message;
  }
}

TEST(Llama, activation_checkpointing_gives_bitwise_equal_gradients) {
  nn::LlamaConfig c = small(true);
  const Tensor idx = tokens(2, 11, c.vocab_size, 7), targets = tokens(2, 11, c.vocab_size, 8);
  std::vector<std::vector<Tensor>> grads;
  std::vector<double> losses;
  for (bool on : {false, true}) {
    c.activation_checkpointing = on;
    const auto model = make(c, 9);
    perturb_norms(*model, 3);
    const Tensor out = model->forward(idx);
    EXPECT_EQ(std::string(grad_fn(out)->name()) == "CheckpointOutput", on);
    const Loss l = model->loss(idx, targets, nn::BatchLayout::padded({11, 7}, Device::cpu()));
    losses.push_back(l.sum.item());
    backward(l.sum);
    grads.push_back(grads_of(*model));
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(test::all_equal(grads[1][i], grads[0][i])) << i;
}

// Right-padded rows and packed documents each compute as the sequence alone.
TEST(Llama, padded_and_packed_batches_equal_each_sequence_alone) {
  for (bool qwen3 : {false, true}) {
    nn::LlamaConfig c = small(qwen3);
    if (!qwen3) c.rope_scaling = {nn::RopeScaling::Type::llama3, 4.0, 1.0, 4.0, 16};
    const auto model = make(c, 10);
    perturb_norms(*model, 4);
    NoGradGuard no_grad;
    const int64_t T = 8;
    const Tensor idx = tokens(2, T, c.vocab_size, 9);
    // Padded: row 0 holds 5 tokens, row 1 all 8.
    const Tensor padded = model->forward(idx, nn::BatchLayout::padded({5, 8}, Device::cpu()));
    const Tensor alone0 = model->forward(narrow(narrow(idx, 0, 0, 1), 1, 0, 5));
    const Tensor alone1 = model->forward(narrow(idx, 0, 1, 1));
    EXPECT_LE(max_rel(narrow(narrow(padded, 0, 0, 1), 1, 0, 5), alone0), 1e-13);
    EXPECT_LE(max_rel(narrow(padded, 0, 1, 1), alone1), 1e-13);
    // Packed: documents of 5, 7 (across the row boundary) and 4 tokens.
    const Tensor packed =
        model->forward(idx, nn::BatchLayout::packed_documents({5, 7, 4}, 2, T, Device::cpu()));
    const Tensor flat_idx = reshape(idx, {1, 2 * T}), flat = reshape(packed, {1, 2 * T, c.hidden});
    int64_t start = 0;
    for (int64_t len : {5, 7, 4}) {
      const Tensor alone = model->forward(narrow(flat_idx, 1, start, len));
      EXPECT_LE(max_rel(narrow(flat, 1, start, len), alone), 1e-13) << "document at " << start;
      start += len;
    }
  }
}

// Note [Documents within rows]: documents that start every row attend per
// row through the bias, as the packed path computes them, gradients too.
TEST(Llama, documents_within_rows_equal_the_packed_path) {
  const nn::LlamaConfig c = small(false);
  const int64_t T = 8;
  const Tensor idx = tokens(3, T, c.vocab_size, 21);
  // Rows of 3 + 5, 8 and 2 + 1 + 5 tokens (a row start is a document start).
  const std::vector<int64_t> lengths = {3, 5, 8, 2, 1, 5};
  std::vector<int64_t> cu = {0}, positions;
  for (int64_t len : lengths) {
    cu.push_back(cu.back() + len);
    for (int64_t p = 0; p < len; ++p)
      positions.push_back(p);
  }
  const Tensor cu_t = from_vector<int64_t>(cu, {static_cast<int64_t>(cu.size())});
  const Tensor pos_t = from_vector<int64_t>(positions, {3, T});
  std::vector<int64_t> targets = tokens(3, T, c.vocab_size, 22).to_vector<int64_t>();
  targets[4] = -100;
  const Tensor y = from_vector<int64_t>(targets, {3, T});
  auto run = [&](const nn::BatchLayout& layout) {
    const auto model = make(c, 23);
    perturb_norms(*model, 24);
    const Loss loss = model->loss(idx, y, layout);
    backward(loss.sum);
    std::vector<Tensor> grads;
    for (const Tensor& p : model->parameters())
      grads.push_back(grad(p).clone());
    return std::make_pair(loss.sum.item(), grads);
  };
  const auto [packed_loss, packed_grads] = run(nn::BatchLayout::packed(cu_t, pos_t));
  const auto [rows_loss, rows_grads] = run(nn::BatchLayout::documents_within_rows(pos_t));
  EXPECT_NEAR(rows_loss, packed_loss, 1e-12 * std::abs(packed_loss));
  ASSERT_EQ(rows_grads.size(), packed_grads.size());
  for (size_t i = 0; i < rows_grads.size(); ++i)
    EXPECT_LE(max_rel(rows_grads[i], packed_grads[i]), 1e-10) << "parameter " << i;
  // Without the documents the rows would attend whole: the bias matters.
  const auto [full_loss, full_grads] = run(nn::BatchLayout::full());
  EXPECT_GT(std::abs(full_loss - packed_loss), 1e-6 * std::abs(packed_loss));
}

TEST(Llama, documents_within_rows_refuse_a_document_across_rows) {
  const nn::LlamaConfig c = small(false);
  const auto model = make(c, 25);
  const Tensor idx = tokens(2, 8, c.vocab_size, 26);
  // Documents of 5, 7 and 4 tokens: the second crosses from row 0 into row 1.
  const nn::BatchLayout across = nn::BatchLayout::packed_documents({5, 7, 4}, 2, 8, Device::cpu());
  EXPECT_ERROR(model->forward(idx, nn::BatchLayout::documents_within_rows(across.positions)),
               "Llama::forward: documents within rows, but row 1 has position 3 at token 0 after "
               "-1");
  EXPECT_ERROR(nn::BatchLayout::documents_within_rows(Tensor()),
               "BatchLayout::documents_within_rows: needs the positions");
  EXPECT_ERROR(model->forward(idx, nn::BatchLayout::documents_within_rows(
                                       from_vector<int64_t>({0, 1, 2}, {1, 3}))),
               "Llama::forward: documents within rows need i64 positions [B = 2, T = 8]");
}

TEST(Llama, packed_positions_derived_from_the_offsets) {
  // Documents of 3, 0 (empty), 6 and 7 tokens over 2 rows of 8.
  const Tensor cu = from_vector<int64_t>({0, 3, 3, 9, 16}, {5});
  const std::vector<int64_t> expected = {0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6};
  const Tensor p = nn::positions_from_cu_seqlens(cu, 2, 8);
  EXPECT_EQ(p.shape(), (Shape{2, 8}));
  EXPECT_EQ(p.dtype(), DType::i64);
  EXPECT_EQ(p.contiguous().to_vector<int64_t>(), expected);
  // The forward without positions equals the one given them.
  const nn::LlamaConfig c = small(true);
  const auto model = make(c, 14);
  NoGradGuard no_grad;
  const Tensor idx = tokens(2, 8, c.vocab_size, 12);
  EXPECT_TRUE(test::all_equal(
      model->forward(idx, nn::BatchLayout::packed(cu)),
      model->forward(idx, nn::BatchLayout::packed(cu, from_vector<int64_t>(expected, {2, 8})))));
}

TEST(Llama, initialization_as_transformers) {
  nn::LlamaConfig c = small(true);
  c.attention_bias = true;
  const auto model = make(c, 11, DType::f32);
  for (const nn::NamedParameter& p : model->named_parameters()) {
    const std::vector<double> v = detach(p.tensor).to(DType::f64).to_vector<double>();
    double sum = 0, sq = 0;
    for (double x : v) {
      sum += x;
      sq += x * x;
    }
    const double n = static_cast<double>(v.size()), mean = sum / n;
    const double std = std::sqrt(sq / n - mean * mean);
    if (p.name.find("norm") != std::string::npos) {
      EXPECT_EQ(mean, 1.0) << p.name;
      EXPECT_EQ(std, 0.0) << p.name;
    } else if (p.tensor.dim() == 1) {
      EXPECT_EQ(sq, 0.0) << p.name << ": biases start at zero";
    } else {
      EXPECT_NEAR(std, c.initializer_range, 0.1 * c.initializer_range) << p.name;
      EXPECT_NEAR(mean, 0.0, 0.1 * c.initializer_range) << p.name;
    }
  }
  // A seed gives the same model.
  const auto again = make(c, 11, DType::f32);
  for (size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_TRUE(test::all_equal(again->parameters()[i], model->parameters()[i]));
}

TEST(Llama, loads_a_transformers_directory) {
  const std::string dir = std::string(ACCRUE_NN_FIXTURES) + "/hf_qwen3_tiny";
  const auto model = nn::Llama::from_hf(dir, {Device::cpu(), DType::f64, nullptr});
  EXPECT_TRUE(model->config().qk_norm && model->config().tie_word_embeddings);
  const nn::HFLlamaCheckpoint ckpt = nn::load_hf_llama_checkpoint(dir);
  const std::map<std::string, Tensor> state = model->state_dict();
  for (const auto& [name, t] : ckpt.tensors) {
    if (name == "lm_head.weight") continue;
    EXPECT_TRUE(test::all_equal(state.at(name), t.to(DType::f64))) << name;
  }
  // Into a model of another architecture: refused, naming the field.
  const auto llama = make(nn::LlamaConfig::llama_tiny(), 12, DType::f32);
  EXPECT_ERROR(llama->load_hf(dir), "Llama::load_hf", dir.c_str(), "vocab_size");
}

// Note [One load path]: loading after a ParamStore holds the parameters
// writes the f32 masters exactly and the bf16 compute copy from them.
TEST(Llama, load_hf_after_a_param_store_with_a_bf16_compute_copy) {
  const std::string dir = std::string(ACCRUE_NN_FIXTURES) + "/hf_llama_tiny";
  const nn::HFLlamaCheckpoint ckpt = nn::load_hf_llama_checkpoint(dir);
  const auto model = make(ckpt.config, 15, DType::f32);
  optim::ParamStore store(model->named_parameters(),
                          optim::ParamStoreOptions().compute_dtype(DType::bf16));
  model->load_hf(dir);
  const std::map<std::string, Tensor> state = model->state_dict();
  std::map<std::string, Tensor> params;
  for (const nn::NamedParameter& p : model->named_parameters())
    params.emplace(p.name, p.tensor);
  for (const auto& [name, t] : ckpt.tensors) {
    EXPECT_TRUE(test::all_equal(state.at(name), t)) << name;
    EXPECT_EQ(params.at(name).dtype(), DType::bf16) << name;
    EXPECT_TRUE(test::all_equal(detach(params.at(name)), t.to(DType::bf16))) << name;
  }
  // It trains from there: a loss through the bf16 compute copy.
  const Loss l = model->loss(tokens(1, 6, ckpt.config.vocab_size, 13),
                             tokens(1, 6, ckpt.config.vocab_size, 14));
  EXPECT_TRUE(std::isfinite(l.sum.item()));
}

// Note [FP8 codes in the compute slots]: the store moves FP8 layers' weights
// to their f32 masters; save_hf still writes one dtype, the compute copy's
// values, and the FP8 weights' values are their masters rounded to it.
TEST(Llama, save_hf_with_fp8_codes_in_the_compute_slots_writes_the_compute_dtype) {
  const std::string dir = std::string(ACCRUE_NN_FIXTURES) + "/hf_llama_tiny";
  const nn::HFLlamaCheckpoint ckpt = nn::load_hf_llama_checkpoint(dir);
  const auto model = make(ckpt.config, 15, DType::f32);
  model->load_hf(dir);
  optim::ParamStore store(model->named_parameters(),
                          optim::ParamStoreOptions().compute_dtype(DType::bf16));
  store.keep_fp8_copies(model->use_fp8());
  std::map<std::string, Tensor> params;
  for (const nn::NamedParameter& p : model->named_parameters())
    params.emplace(p.name, p.tensor);
  EXPECT_EQ(params.at("model.layers.0.self_attn.q_proj.weight").dtype(), DType::f32);
  EXPECT_EQ(params.at("model.norm.weight").dtype(), DType::bf16);
  const std::string out =
      (std::filesystem::temp_directory_path() / "accrue_llama_fp8_save_hf").string();
  std::filesystem::remove_all(out);
  model->save_hf(out);
  const nn::HFLlamaCheckpoint back = nn::load_hf_llama_checkpoint(out);
  ASSERT_EQ(back.tensors.size(), ckpt.tensors.size());
  for (const auto& [name, t] : ckpt.tensors) {
    EXPECT_EQ(back.tensors.at(name).dtype(), DType::bf16) << name;
    EXPECT_TRUE(test::all_equal(back.tensors.at(name), t.to(DType::bf16))) << name;
  }
  std::filesystem::remove_all(out);
}

TEST(Llama, bad_inputs_are_refused_naming_the_values) {
  const nn::LlamaConfig c = small(false);
  const auto model = make(c, 13, DType::f32);
  const Tensor idx = tokens(2, 8, c.vocab_size, 10), targets = tokens(2, 8, c.vocab_size, 11);
  // Targets out of the vocabulary.
  std::vector<int64_t> t = targets.to_vector<int64_t>();
  t[3] = c.vocab_size;
  EXPECT_ERROR(model->loss(idx, from_vector<int64_t>(t, {2, 8})), "classifier", "target 96",
               "[0, 96)");
  t[3] = -5;
  EXPECT_ERROR(model->loss(idx, from_vector<int64_t>(t, {2, 8})), "classifier", "target -5",
               "[0, 96)");
  std::vector<int64_t> ids = idx.to_vector<int64_t>();
  ids[3] = 300;
  EXPECT_ERROR(model->forward(from_vector<int64_t>(ids, {2, 8})), "embedding", "index 300",
               "[0, 96)");
  EXPECT_ERROR(model->loss(idx, tokens(2, 7, c.vocab_size, 1)), "Llama::loss", "[2, 7]", "[2, 8]");
  EXPECT_ERROR(model->forward(idx.to(DType::f32)), "Llama::forward", "i32 or i64");
  EXPECT_ERROR(model->forward(reshape(idx, {16})), "Llama::forward", "[B, T]");
  EXPECT_ERROR(model->forward(tokens(1, c.max_positions + 1, c.vocab_size, 2)), "Llama::forward",
               "T = 129", "max_position_embeddings = 128");
  // Lengths past T, or one per sequence missing.
  EXPECT_ERROR(model->forward(idx, nn::BatchLayout::padded({8, 9}, Device::cpu())),
               "Llama::forward", "seq_lens[1] = 9", "T = 8");
  EXPECT_ERROR(model->forward(idx, nn::BatchLayout::padded({8, 8, 8}, Device::cpu())),
               "Llama::forward", "seq_lens", "[B = 2]", "[3]");
  // Packed layouts that do not cover the batch, or mixed with padding.
  const nn::BatchLayout packed = nn::BatchLayout::packed_documents({10, 6}, 2, 8, Device::cpu());
  EXPECT_ERROR(model->forward(tokens(2, 9, c.vocab_size, 3), packed), "Llama::forward", "positions",
               "[B = 2, T = 9]");
  EXPECT_ERROR(model->forward(idx, nn::BatchLayout::packed(from_vector<int64_t>({0, 10, 15}, {3}),
                                                           packed.positions)),
               "Llama::forward", "cu_seqlens runs from 0 to 15", "B * T = 16");
  EXPECT_ERROR(
      model->forward(idx, nn::BatchLayout::packed(from_vector<int64_t>({0, 10, 6, 16}, {4}),
                                                  packed.positions)),
      "Llama::forward", "cu_seqlens decreases at 2: 10 then 6");
  nn::BatchLayout both = packed;
  both.seq_lens = from_vector<int64_t>({8, 8}, {2});
  EXPECT_ERROR(model->forward(idx, both), "Llama::forward", "not both");
  nn::BatchLayout positions_only;
  positions_only.positions = packed.positions;
  EXPECT_ERROR(model->forward(idx, positions_only), "Llama::forward", "positions",
               "only with a packed layout");
  EXPECT_ERROR(nn::BatchLayout::packed_documents({10, 7}, 2, 8, Device::cpu()), "packed_documents",
               "document 1 has length 7", "6");
  EXPECT_ERROR(nn::BatchLayout::packed_documents({10, 5}, 2, 8, Device::cpu()), "packed_documents",
               "15 tokens", "B * T = 16");
  nn::LlamaConfig bad = c;
  bad.kv_heads = 3;
  EXPECT_ERROR(make(bad, 1), "kv");
}

}  // namespace
}  // namespace accrue
