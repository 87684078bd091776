// The model a trainer trains, behind one interface, so that accrue_train's
// loop, options, data, data parallelism, bench line and checkpoints are one
// code path for every family: GPT-2 (nn::GPT2) and the Llama family
// (nn::Llama: Llama 2/3/3.2, Qwen3, a Hugging Face directory).
//
//   std::unique_ptr<TrainModel> m = make_train_model({"gpt2-d12", 1024}, {device, f32, &gen});
//   window.backward(m->loss(inputs, targets, nn::BatchLayout::full()));
//
// Checkpoints need nothing from the model: the trainer writes the store's
// master weights under the parameters' names (Note [Llama trainer checkpoint]).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "accrue/nn/gpt2.h"
#include "accrue/nn/llama.h"
#include "examples/common/json.h"

namespace accrue::examples {

// How --synthetic draws full rows for a model (Note [Synthetic rows]).
struct SyntheticRows {
  int64_t low = 0;           // tokens uniform on [low, vocab)
  uint64_t seed_offset = 1;  // the generator's seed: --seed + seed_offset + rank
  DType dtype = DType::i64;
};

class TrainModel {
 public:
  virtual ~TrainModel() = default;

  virtual std::vector<nn::NamedParameter> named_parameters() const = 0;
  // The next-token loss (sum, count) of one micro-batch. A model without
  // packed documents (packed_documents() false) takes BatchLayout::full() only.
  virtual Loss loss(const Tensor& idx, const Tensor& targets,
                    const nn::BatchLayout& layout) const = 0;
  // Whether loss() takes packed documents (offsets and positions per row).
  virtual bool packed_documents() const = 0;
  // MFU's model FLOPs of one trained token at sequence length T.
  virtual double flops_per_token(int64_t T) const = 0;
  virtual int64_t parameter_count() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual bool activation_checkpointing() const = 0;
  // AdamW's decay group: whether the optimizer decays this parameter.
  virtual bool decays(const nn::NamedParameter& p) const = 0;
  // One line for the start-up banner.
  virtual std::string describe() const = 0;
  // The configuration's keys of --bench's JSON line.
  virtual void describe_json(JsonObject& c) const = 0;
  virtual SyntheticRows synthetic_rows() const { return {}; }
  // Copies Hugging Face weights into the parameters (Note [One load path]):
  // GPT-2 from a GPT2LMHeadModel safetensors file (nn/gpt2_hf.h), the Llama
  // family from a directory whose config.json describes this model.
  virtual void init_from(const std::string& path) = 0;
  // Dropout on (training) or off (validation); a model without dropout ignores it.
  virtual void set_training(bool training) = 0;
  // The dropout masks' generator, whose offset a checkpoint keeps; null without dropout.
  virtual Generator* dropout_generator() { return nullptr; }
  // Note [FP8 linear]: the model's projections compute in FP8; returns their
  // weights, for ParamStore::keep_fp8_copies.
  virtual std::vector<Tensor> use_fp8(const Fp8LinearOptions& options) = 0;
};

struct TrainModelOptions {
  std::string name;  // a preset of train_model_presets() or hf:DIR (GPT-2 or Llama family)
  int64_t seq_len = 0;
  bool activation_checkpointing = false;
  double dropout = 0.0;  // GPT-2 only; a Llama-family model has none
  // GPT-2 only: the preset's sizes overridden (accrue_train_gpt2's --n-layer ...).
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  // GPT-2 only: the loss through examples/composed_gpt2 (public primitives, no fused op).
  bool composed = false;
  uint64_t dropout_seed = 0;  // GPT-2's dropout generator
};

// The presets make_train_model builds: GPT-2's (gpt2-tiny, gpt2-d12 .. gpt2-d48)
// then the Llama family's (nn::LlamaConfig::preset_names()).
std::vector<std::string> train_model_presets();
// Whether `name` is a preset or hf:DIR (a GPT-2 or Llama-family Hugging Face directory).
bool is_train_model_name(const std::string& name);
// Whether `name` names a GPT-2 preset.
bool is_gpt2_model_name(const std::string& name);
// Whether `name` is hf:DIR with a GPT-2 config.json (model_type "gpt2"); an
// hf:DIR whose config.json cannot be read is refused naming the file.
bool is_hf_gpt2_model(const std::string& name);

// Builds the model (loads hf:DIR's weights). A --seq-len longer than a
// preset's positions is a usage error; a Hugging Face directory's an Error.
std::unique_ptr<TrainModel> make_train_model(const TrainModelOptions& o,
                                             const nn::ParamOptions& params);

// gpt2-tiny: 2 layers, 4 heads, width 64, vocabulary 256 (bytes), block 64.
nn::GPT2Config gpt2_tiny_config();
// The trainers' --n-layer .. --block-size overrides applied to `c` (its
// vocabulary padding then follows vocab_size), and the checks both trainers
// make of the result: a vocabulary that fits uint16 shards, the sizes whose
// products must fit in int64, GPT2Config::validate(); each a UsageError.
void apply_gpt2_sizes(nn::GPT2Config& c, const std::optional<int64_t>& n_layer,
                      const std::optional<int64_t>& n_head, const std::optional<int64_t>& n_embd,
                      const std::optional<int64_t>& vocab_size,
                      const std::optional<int64_t>& block_size);

// Model FLOPs per trained token (forward + backward) at sequence length T:
// Note [GPT-2 FLOPs per token] and Note [Llama FLOPs per token].
double flops_per_token(const nn::GPT2Config& c, int64_t T);
double flops_per_token(const nn::LlamaConfig& c, int64_t T);

}  // namespace accrue::examples
