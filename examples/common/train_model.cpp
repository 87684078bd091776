#include "examples/common/train_model.h"

#include <cstdio>
#include <filesystem>
#include <limits>

#include "accrue/nn/gpt2_hf.h"
#include "accrue/nn/hf_checkpoint.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"  // error_message
#include "examples/composed_gpt2/composed_gpt2.h"

namespace accrue::examples {

namespace {

constexpr const char* kGpt2Prefix = "gpt2-";

std::vector<std::string> gpt2_presets() {
  return {"gpt2-tiny", "gpt2-d12", "gpt2-d24", "gpt2-d36", "gpt2-d48"};
}

nn::GPT2Config gpt2_config(const std::string& name) {
  if (name == "gpt2-tiny") return gpt2_tiny_config();
  return nn::GPT2Config::from_name(name.substr(std::string(kGpt2Prefix).size()));
}

// Note [Synthetic rows]
// ~~~~~~~~~~~~~~~~~~~~~
// accrue_train's --synthetic-documents full draws each micro-batch as one
// randint of [B, T + 1] on the device, inputs the first T columns and targets
// the last T. For GPT-2 it draws exactly what accrue_train_gpt2 --synthetic
// draws (tokens on [1, vocab), i32, generator seeded --seed + 1000 + rank), so
// the two trainers on the same model, seed and batch compute the same run bit
// for bit (tests/examples/cli_test.sh checks their final losses); Llama keeps
// its own stream ([0, vocab), i64, --seed + 1 + rank), which its checkpoints
// and the PyTorch baselines' comparisons already use.
class Gpt2TrainModel final : public TrainModel {
 public:
  Gpt2TrainModel(const nn::GPT2Config& c, const nn::ParamOptions& params, bool composed)
      : model_(c, params) {
    if (composed) composed_ = std::make_unique<ComposedGPT2>(model_);
  }

  std::vector<nn::NamedParameter> named_parameters() const override {
    return model_.named_parameters();
  }
  Loss loss(const Tensor& idx, const Tensor& targets,
            const nn::BatchLayout& layout) const override {
    ACCRUE_CHECK(!layout.is_packed() && !layout.is_padded(),
                 "GPT-2 loss: takes full rows only, not packed or padded documents");
    return composed_ ? composed_->loss(idx, targets) : model_.loss(idx, targets);
  }
  bool packed_documents() const override { return false; }
  double flops_per_token(int64_t T) const override {
    return examples::flops_per_token(model_.config(), T);
  }
  int64_t parameter_count() const override { return model_.config().parameter_count(); }
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  bool activation_checkpointing() const override {
    return model_.config().activation_checkpointing;
  }
  // As accrue_train_gpt2: the Linear weights only, never wte, wpe, biases, LayerNorms.
  bool decays(const nn::NamedParameter& p) const override {
    return p.tensor.dim() >= 2 && p.name != "wte" && p.name != "wpe";
  }
  std::string describe() const override {
    const nn::GPT2Config& c = model_.config();
    char s[256];
    std::snprintf(s, sizeof s,
                  "GPT-2, %lld layers, %lld heads, width %lld, vocab %lld (padded %lld), block "
                  "%lld, %lld parameters",
                  (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd,
                  (long long)c.vocab_size, (long long)c.padded_vocab(), (long long)c.block_size,
                  (long long)c.parameter_count());
    return s;
  }
  // accrue_train_gpt2 --bench's keys.
  void describe_json(JsonObject& j) const override {
    const nn::GPT2Config& c = model_.config();
    j.integer("n_layer", c.n_layer)
        .integer("n_head", c.n_head)
        .integer("n_embd", c.n_embd)
        .integer("vocab_size", c.vocab_size)
        .integer("block_size", c.block_size);
  }
  SyntheticRows synthetic_rows() const override { return {1, 1000, DType::i32}; }
  void init_from(const std::string& path) override { nn::load_hf_gpt2(model_, path); }
  void set_training(bool training) override {
    if (training) {
      model_.train();
    } else {
      model_.eval();
    }
  }
  Generator* dropout_generator() override { return &model_.dropout_generator(); }
  std::vector<Tensor> use_fp8(const Fp8LinearOptions& o) override { return model_.use_fp8(o); }

 private:
  nn::GPT2 model_;
  mutable std::unique_ptr<ComposedGPT2> composed_;  // keeps its positions and mask
};

class LlamaTrainModel final : public TrainModel {
 public:
  explicit LlamaTrainModel(std::unique_ptr<nn::Llama> model) : model_(std::move(model)) {}

  std::vector<nn::NamedParameter> named_parameters() const override {
    return model_->named_parameters();
  }
  Loss loss(const Tensor& idx, const Tensor& targets,
            const nn::BatchLayout& layout) const override {
    return model_->loss(idx, targets, layout);
  }
  bool packed_documents() const override { return true; }
  double flops_per_token(int64_t T) const override {
    return examples::flops_per_token(model_->config(), T);
  }
  int64_t parameter_count() const override { return model_->config().parameter_count(); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  bool activation_checkpointing() const override {
    return model_->config().activation_checkpointing;
  }
  // No decay on norms (fewer than 2 dimensions).
  bool decays(const nn::NamedParameter& p) const override { return p.tensor.dim() >= 2; }
  std::string describe() const override {
    const nn::LlamaConfig& c = model_->config();
    char s[256];
    std::snprintf(s, sizeof s,
                  "%lld layers, hidden %lld, %lld query / %lld kv heads, head_dim %lld, ffn "
                  "%lld, vocab %lld%s%s, %lld parameters",
                  (long long)c.layers, (long long)c.hidden, (long long)c.heads,
                  (long long)c.kv_heads, (long long)c.head_dim, (long long)c.intermediate,
                  (long long)c.vocab_size, c.tie_word_embeddings ? ", tied" : "",
                  c.qk_norm ? ", QK-norm" : "", (long long)c.parameter_count());
    return s;
  }
  void describe_json(JsonObject& j) const override {
    const nn::LlamaConfig& c = model_->config();
    j.integer("layers", c.layers)
        .integer("hidden", c.hidden)
        .integer("heads", c.heads)
        .integer("kv_heads", c.kv_heads)
        .integer("head_dim", c.head_dim)
        .integer("intermediate", c.intermediate)
        .integer("vocab_size", c.vocab_size)
        .boolean("tied", c.tie_word_embeddings)
        .boolean("qk_norm", c.qk_norm);
  }
  void init_from(const std::string& path) override { model_->load_hf(path); }
  void set_training(bool) override {}
  std::vector<Tensor> use_fp8(const Fp8LinearOptions& o) override { return model_->use_fp8(o); }

 private:
  std::unique_ptr<nn::Llama> model_;
};

}  // namespace

nn::GPT2Config gpt2_tiny_config() {
  nn::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.block_size = 64;
  return c;
}

std::vector<std::string> train_model_presets() {
  std::vector<std::string> names = gpt2_presets();
  for (const std::string& n : nn::LlamaConfig::preset_names())
    names.push_back(n);
  return names;
}

bool is_gpt2_model_name(const std::string& name) {
  for (const std::string& n : gpt2_presets())
    if (n == name) return true;
  return false;
}

bool is_hf_gpt2_model(const std::string& name) {
  if (name.rfind("hf:", 0) != 0) return false;
  const std::string config = (std::filesystem::path(name.substr(3)) / "config.json").string();
  return nn::hf_model_type(nn::read_hf_config_text(config, "--model hf:DIR"), config) == "gpt2";
}

bool is_train_model_name(const std::string& name) {
  if (name.rfind("hf:", 0) == 0) return true;
  for (const std::string& n : train_model_presets())
    if (n == name) return true;
  return false;
}

void apply_gpt2_sizes(nn::GPT2Config& c, const std::optional<int64_t>& n_layer,
                      const std::optional<int64_t>& n_head, const std::optional<int64_t>& n_embd,
                      const std::optional<int64_t>& vocab_size,
                      const std::optional<int64_t>& block_size) {
  if (n_layer) c.n_layer = *n_layer;
  if (n_head) c.n_head = *n_head;
  if (n_embd) c.n_embd = *n_embd;
  if (vocab_size) c.vocab_size = *vocab_size;
  if (block_size) c.block_size = *block_size;
  c.padded_vocab_size = 0;  // the default padding of whatever vocab_size is now
  if (c.vocab_size > 65536)
    usage_error("--vocab-size ", c.vocab_size, " does not fit the shards' uint16 tokens");
  // The largest tensors and the parameter count (12 C^2 per layer) must fit in
  // int64 before validate() or the model computes with them. vocab_size is at
  // most 65536 here, so its padding (to a multiple of 128) cannot overflow.
  checked_product({{"--n-embd", c.n_embd}, {"--n-embd", c.n_embd}, {"--n-layer", c.n_layer}},
                  std::numeric_limits<int64_t>::max() / 16);
  checked_product({{"--n-embd", c.n_embd}, {"--block-size", c.block_size}});
  checked_product({{"--n-embd", c.n_embd}, {"--vocab-size (padded)", c.vocab_size + 128}});
  try {
    c.validate();
  } catch (const Error& e) {
    usage_error(error_message(e));  // Note [Error locations]: no source location
  }
}

std::unique_ptr<TrainModel> make_train_model(const TrainModelOptions& o,
                                             const nn::ParamOptions& params) {
  // hf:DIR: a GPT-2 directory or a Llama-family one, which Llama::from_hf
  // reads and refuses.
  const bool hf = o.name.rfind("hf:", 0) == 0;
  const std::filesystem::path dir = hf ? o.name.substr(3) : std::string();
  const std::string config_json = (dir / "config.json").string();
  const bool hf_gpt2 = is_hf_gpt2_model(o.name);
  const bool gpt2 = is_gpt2_model_name(o.name) || hf_gpt2;
  if (o.dropout > 0.0 && !gpt2) usage_error("--dropout: ", o.name, " has no dropout (GPT-2 only)");
  if (o.composed && !gpt2)
    usage_error("--composed: ", o.name, " has no composed form (GPT-2 only)");
  if ((o.n_layer || o.n_head || o.n_embd || o.vocab_size || o.block_size) &&
      !is_gpt2_model_name(o.name))
    usage_error(
        "--n-layer, --n-head, --n-embd, --vocab-size and --block-size override a GPT-2 "
        "preset's sizes, not ",
        o.name, "'s");
  if (hf && !hf_gpt2) {
    std::unique_ptr<nn::Llama> m =
        nn::Llama::from_hf(dir.string(), params, o.activation_checkpointing);
    ACCRUE_CHECK(o.seq_len <= m->config().max_positions, "--seq-len ", o.seq_len,
                 " is longer than the model's max_position_embeddings ", m->config().max_positions);
    return std::make_unique<LlamaTrainModel>(std::move(m));
  }
  if (gpt2) {
    nn::GPT2Config c = hf_gpt2 ? nn::read_hf_gpt2_config(config_json) : gpt2_config(o.name);
    if (!hf_gpt2) apply_gpt2_sizes(c, o.n_layer, o.n_head, o.n_embd, o.vocab_size, o.block_size);
    if (o.seq_len > c.block_size)
      usage_error("--seq-len ", o.seq_len, " is longer than ", o.name, "'s block size ",
                  c.block_size);
    c.activation_checkpointing = o.activation_checkpointing;
    c.dropout = o.dropout;
    c.dropout_seed = o.dropout_seed;
    auto m = std::make_unique<Gpt2TrainModel>(c, params, o.composed);
    if (hf_gpt2) m->init_from((dir / "model.safetensors").string());
    return m;
  }
  nn::LlamaConfig c = nn::LlamaConfig::from_name(o.name);
  if (o.seq_len > c.max_positions)
    usage_error("--seq-len ", o.seq_len, " is longer than ", o.name, "'s max_position_embeddings ",
                c.max_positions);
  c.activation_checkpointing = o.activation_checkpointing;
  return std::make_unique<LlamaTrainModel>(std::make_unique<nn::Llama>(c, params));
}

// Note [GPT-2 FLOPs per token]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// accrue_train_gpt2's and accrue_train's MFU for GPT-2, the standard estimate
// (Kaplan et al.; PaLM appendix B; nanoGPT's estimate_mfu):
//   6 N + 12 L T C,
// N the parameters every token's matmuls use: all of them except wpe (a
// lookup, no matmul) and wte's padded rows (never part of the softmax); wte
// stays in, as the tied output layer's weight. 6 N: 2 FLOPs per multiply-add
// forward, 4 backward. 12 L T C: attention's QK^T and AV over T keys (causal
// masking not discounted); L layers, C the width, T the sequence length.
// bench/torch_gpt2.py counts the same.
double flops_per_token(const nn::GPT2Config& c, int64_t T) {
  const int64_t N =
      c.parameter_count() - c.block_size * c.n_embd - (c.padded_vocab() - c.vocab_size) * c.n_embd;
  return 6.0 * static_cast<double>(N) + 12.0 * static_cast<double>(c.n_layer * T * c.n_embd);
}

// Note [Llama FLOPs per token]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MFU's model FLOPs of one trained token (forward + backward), the estimate
// of GPT-2's trainer (6 N + 12 L T C) with every Llama matmul counted:
//   6 x (L x (d q + 2 d kv + q d + 3 d f) + d V)  +  12 x L x H x hd x T
// with d the hidden size, H the query heads, hd head_dim, q = H hd, kv =
// kv_heads hd (grouped-query attention: k_proj and v_proj are narrower), f
// the SwiGLU width (gate, up, down), V the vocabulary (the classifier, tied
// or not), L layers, T the sequence length. 6 = 2 FLOPs per multiply-add
// forward, 4 backward. Attention per token, layer and query head: scores
// (QK^T) and PV are 2 T hd FLOPs each forward, so 4 H hd T forward and 12 H
// hd T with backward, over all T keys: causal masking and document
// boundaries are not discounted, so a packed batch of short documents does
// less work than this counts. Not counted: the embedding lookup, norms,
// RoPE, SwiGLU's product, softmax, biases. docs/MODELS.md writes it out for
// the PyTorch baselines, whose MFU must count the same FLOPs.
double flops_per_token(const nn::LlamaConfig& c, int64_t T) {
  const double d = static_cast<double>(c.hidden), f = static_cast<double>(c.intermediate);
  const double q = static_cast<double>(c.heads * c.head_dim);
  const double kv = static_cast<double>(c.kv_heads * c.head_dim);
  const double L = static_cast<double>(c.layers), V = static_cast<double>(c.vocab_size);
  const double matmul_weights = L * (d * q + 2 * d * kv + q * d + 3 * d * f) + d * V;
  return 6 * matmul_weights + 12 * L * q * static_cast<double>(T);
}

}  // namespace accrue::examples
