// accrue._accrue.nn's Llama family: LlamaConfig (presets and Hugging Face
// config.json), BatchLayout, RMSNorm, Llama (from_hf, load_hf, save_hf, loss,
// logits), LlamaKVCache and generate_greedy.
#include <nanobind/nanobind.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "accrue/nn/llama.h"
#include "accrue/nn/llama_config.h"
#include "accrue/nn/llama_generate.h"
#include "bindings.h"

namespace accrue::python {

namespace {

nn::ParamOptions param_options(Device device, DType dtype, Generator* generator) {
  return nn::ParamOptions{device, dtype, generator};
}

#define ACCRUE_PARAM_KWARGS                                                \
  nb::kw_only(), nb::arg("device") = "cpu", nb::arg("dtype") = DType::f32, \
                 nb::arg("generator") = nb::none()

// The __init__ of a Llama part built from a config on its own (initialized
// as a Llama's layers are), for nb::arg("config"), ACCRUE_PARAM_KWARGS.
template <class Part>
auto from_config() {
  return [](Part* self, const nn::LlamaConfig& config, DeviceArg device, DType dtype,
            Generator* gen) { new (self) Part(config, param_options(device, dtype, gen)); };
}

}  // namespace

void bind_llama(nb::module_& m) {
  using nn::LlamaConfig;
  nb::class_<nn::RopeScaling> scaling(
      m, "RopeScaling",
      "A LlamaConfig's rotary frequency scaling (config.json's rope_scaling): none, or Llama "
      "3's (type llama3).");
  nb::enum_<nn::RopeScaling::Type>(scaling, "Type", "The kind of frequency scaling.")
      .value("none", nn::RopeScaling::Type::none, "The plain frequencies.")
      .value("llama3", nn::RopeScaling::Type::llama3, "Llama 3's wavelength-band scaling.");
  scaling.def(nb::init<>(), "No scaling.")
      .def_rw("type", &nn::RopeScaling::type, "none or llama3.")
      .def_rw("factor", &nn::RopeScaling::factor, "Divisor of the long wavelengths.")
      .def_rw("low_freq_factor", &nn::RopeScaling::low_freq_factor, "Low-frequency band edge.")
      .def_rw("high_freq_factor", &nn::RopeScaling::high_freq_factor, "High-frequency band edge.")
      .def_rw("original_max_position_embeddings",
              &nn::RopeScaling::original_max_position_embeddings,
              "The context length the model was pretrained at.")
      .def(nb::self == nb::self, "Field by field.");

  nb::class_<LlamaConfig>(m, "LlamaConfig",
                          "A Llama-style decoder's sizes and options (Llama 2/3/3.1/3.2, "
                          "Qwen3; nn/llama_config.h). Presets by name, or read_hf_config.")
      .def(nb::init<>(), "llama-125m's sizes with vocabulary 32000.")
      .def_rw("model_type", &LlamaConfig::model_type, "'llama' or 'qwen3'.")
      .def_rw("vocab_size", &LlamaConfig::vocab_size, "Tokens.")
      .def_rw("hidden", &LlamaConfig::hidden, "hidden_size.")
      .def_rw("intermediate", &LlamaConfig::intermediate, "intermediate_size (SwiGLU width).")
      .def_rw("layers", &LlamaConfig::layers, "num_hidden_layers.")
      .def_rw("heads", &LlamaConfig::heads, "num_attention_heads.")
      .def_rw("kv_heads", &LlamaConfig::kv_heads, "num_key_value_heads (divides heads).")
      .def_rw("head_dim", &LlamaConfig::head_dim, "The width of one head.")
      .def_rw("max_positions", &LlamaConfig::max_positions, "max_position_embeddings.")
      .def_rw("rope_theta", &LlamaConfig::rope_theta, "The rotary base.")
      .def_rw("rope_scaling", &LlamaConfig::rope_scaling, "The rotary frequency scaling.")
      .def_rw("rms_eps", &LlamaConfig::rms_eps, "rms_norm_eps.")
      .def_rw("tie_word_embeddings", &LlamaConfig::tie_word_embeddings,
              "The output layer is the token embedding.")
      .def_rw("qk_norm", &LlamaConfig::qk_norm, "Qwen3's per-head RMSNorm of q and k.")
      .def_rw("attention_bias", &LlamaConfig::attention_bias,
              "Biases on q/k/v/o_proj (transformers' attention_bias).")
      .def_rw("initializer_range", &LlamaConfig::initializer_range,
              "The std of the normal initialization.")
      .def_rw("bos_token_id", &LlamaConfig::bos_token_id, "-1: none.")
      .def_rw("eos_token_ids", &LlamaConfig::eos_token_ids, "Empty: none.")
      .def_rw("activation_checkpointing", &LlamaConfig::activation_checkpointing,
              "Recompute each block in backward.")
      .def_static("from_name", &LlamaConfig::from_name, nb::arg("name"),
                  "A preset: 'llama-125m', 'llama3.2-1b', 'qwen3-0.6b', 'llama-tiny', "
                  "'qwen3-tiny'.")
      .def_static("preset_names", &LlamaConfig::preset_names, "The names from_name knows.")
      .def("validate", &LlamaConfig::validate, "Raises accrue.Error naming a bad field.")
      .def("parameter_count", &LlamaConfig::parameter_count,
           "The parameters the model has (transformers' count), without building it.")
      .def(nb::self == nb::self, "Field by field.");
  m.def("read_hf_config", &nn::read_hf_config, nb::arg("path"),
        "A LlamaConfig from a Hugging Face config.json (model_type llama or qwen3); settings "
        "accrue cannot honour raise accrue.Error naming the key.");
  m.def("write_hf_config", &nn::write_hf_config, nb::arg("config"), nb::arg("path"),
        "Writes a config.json transformers loads as LlamaForCausalLM / Qwen3ForCausalLM.");

  nb::class_<nn::BatchLayout>(
      m, "BatchLayout",
      "How a micro-batch idx [B, T] is laid out: full, padded (right-padded rows) or packed "
      "documents; "
      "Note [Llama batch layouts].")
      .def_static("full", &nn::BatchLayout::full, "Every row one sequence of T tokens.")
      .def_static(
          "padded", [](Tensor seq_lens) { return nn::BatchLayout::padded(std::move(seq_lens)); },
          nb::arg("seq_lens"),
          "Row b holds seq_lens[b] tokens (i64 [B]), right-padded; padded targets must be -100.")
      .def_static(
          "padded",
          [](const std::vector<int64_t>& lens, DeviceArg device) {
            return nn::BatchLayout::padded(lens, device);
          },
          nb::arg("seq_lens"), nb::arg("device") = "cpu", "The same from a list of lengths.")
      .def_static("packed", &nn::BatchLayout::packed, nb::arg("cu_seqlens"),
                  nb::arg("positions") = Tensor(),
                  "Packed documents: cu_seqlens i64 [N + 1] over the B * T tokens read row "
                  "after row; positions [B, T] derived when not given.")
      .def_static("documents_within_rows", &nn::BatchLayout::documents_within_rows,
                  nb::arg("positions"),
                  "Packed documents that each row starts (positions i64 [B, T] restarting at 0 "
                  "with each document): attention per row through a document bias, capturable "
                  "(Note [Documents within rows]).")
      .def_static(
          "packed_documents",
          [](const std::vector<int64_t>& lengths, int64_t B, int64_t T, DeviceArg device) {
            return nn::BatchLayout::packed_documents(lengths, B, T, device);
          },
          nb::arg("doc_lengths"), nb::arg("B"), nb::arg("T"), nb::arg("device") = "cpu",
          "Documents of these lengths laid end to end over B rows of T tokens (sum B * T).")
      .def_ro("seq_lens", &nn::BatchLayout::seq_lens, "i64 [B] (padded).")
      .def_ro("cu_seqlens", &nn::BatchLayout::cu_seqlens, "i64 [N + 1] (packed).")
      .def_ro("positions", &nn::BatchLayout::positions, "i64 [B, T] (packed, optional).")
      .def_prop_ro("is_padded", &nn::BatchLayout::is_padded, "A padded layout.")
      .def_prop_ro("is_packed", &nn::BatchLayout::is_packed, "A packed layout.");

  nb::class_<nn::RMSNorm, nn::Module>(m, "RMSNorm", "RMSNorm over the last dim, weight ones.")
      .def(
          "__init__",
          [](nn::RMSNorm* self, int64_t dim, double eps, DeviceArg device, DType dtype,
             Generator* gen) {
            new (self) nn::RMSNorm(dim, eps, param_options(device, dtype, gen));
          },
          nb::arg("dim"), nb::arg("eps") = 1e-6, ACCRUE_PARAM_KWARGS, "Weight ones [dim].")
      .def("forward", &nn::RMSNorm::forward, nb::arg("input"), "rms_norm(input, weight, eps).")
      .def("__call__", &nn::RMSNorm::forward, nb::arg("input"), "forward(input).")
      .def_prop_ro("weight", &nn::RMSNorm::weight, "The weight [dim].")
      .def_prop_ro("eps", &nn::RMSNorm::eps, "Epsilon.");

  nb::class_<nn::LlamaAttention, nn::Module>(
      m, "LlamaAttention",
      "A Llama layer's self-attention: q/k/v/o_proj, Qwen3's q_norm/k_norm, rope, GQA.")
      .def("__init__", from_config<nn::LlamaAttention>(), nb::arg("config"), ACCRUE_PARAM_KWARGS,
           "The attention of a layer of `config`, initialized as a Llama's layer is.")
      .def("forward", &nn::LlamaAttention::forward, nb::arg("input"), nb::arg("positions"),
           nb::arg("layout") = nn::BatchLayout::full(),
           "input [B, T, hidden], positions i64 [T] or [B, T] -> [B, T, hidden].")
      .def("__call__", &nn::LlamaAttention::forward, nb::arg("input"), nb::arg("positions"),
           nb::arg("layout") = nn::BatchLayout::full(), "forward(input, positions, layout).")
      .def_prop_ro("q_proj", &nn::LlamaAttention::q_proj, nb::rv_policy::reference_internal,
                   "The query projection.")
      .def_prop_ro("k_proj", &nn::LlamaAttention::k_proj, nb::rv_policy::reference_internal,
                   "The key projection.")
      .def_prop_ro("v_proj", &nn::LlamaAttention::v_proj, nb::rv_policy::reference_internal,
                   "The value projection.")
      .def_prop_ro("o_proj", &nn::LlamaAttention::o_proj, nb::rv_policy::reference_internal,
                   "The output projection.")
      .def_prop_ro("q_norm", &nn::LlamaAttention::q_norm, nb::rv_policy::reference_internal,
                   "Qwen3's per-head query RMSNorm, or None.")
      .def_prop_ro("k_norm", &nn::LlamaAttention::k_norm, nb::rv_policy::reference_internal,
                   "Qwen3's per-head key RMSNorm, or None.");
  nb::class_<nn::LlamaMLP, nn::Module>(m, "LlamaMLP", "down_proj(silu(gate_proj(x)) * up_proj(x)).")
      .def("__init__", from_config<nn::LlamaMLP>(), nb::arg("config"), ACCRUE_PARAM_KWARGS,
           "The MLP of a layer of `config`, initialized as a Llama's layer is.")
      .def("forward", &nn::LlamaMLP::forward, nb::arg("input"), "The MLP of input.")
      .def("__call__", &nn::LlamaMLP::forward, nb::arg("input"), "forward(input).")
      .def_prop_ro("gate_proj", &nn::LlamaMLP::gate_proj, nb::rv_policy::reference_internal,
                   "The gate projection.")
      .def_prop_ro("up_proj", &nn::LlamaMLP::up_proj, nb::rv_policy::reference_internal,
                   "The up projection.")
      .def_prop_ro("down_proj", &nn::LlamaMLP::down_proj, nb::rv_policy::reference_internal,
                   "The down projection.");
  nb::class_<nn::LlamaDecoderLayer, nn::Module>(
      m, "LlamaDecoderLayer",
      "One pre-RMSNorm block (Note [Llama residual stream]): attention and MLP, each with its "
      "residual add fused into the next norm.")
      .def("__init__", from_config<nn::LlamaDecoderLayer>(), nb::arg("config"), ACCRUE_PARAM_KWARGS,
           "One layer of `config` (its norms, attention and MLP), initialized as a Llama's is.")
      .def(
          "forward",
          [](const nn::LlamaDecoderLayer& l, const Tensor& x, const Tensor& normed,
             const nn::RMSNorm& next_norm, const Tensor& positions, const nn::BatchLayout& layout) {
            ResidualNorm r = l.forward(x, normed, next_norm, positions, layout);
            return nb::make_tuple(r.sum, r.normed);
          },
          nb::arg("input"), nb::arg("normed"), nb::arg("next_norm"), nb::arg("positions"),
          nb::arg("layout") = nn::BatchLayout::full(),
          "(x, input_layernorm(x)) -> (x', next_norm(x')): the residual stream after this layer "
          "and its normalization by the next layer's (or the final) norm.")
      .def_prop_ro("input_layernorm", &nn::LlamaDecoderLayer::input_layernorm,
                   nb::rv_policy::reference_internal, "The norm before attention.")
      .def_prop_ro("self_attn", &nn::LlamaDecoderLayer::self_attn,
                   nb::rv_policy::reference_internal, "The attention.")
      .def_prop_ro("post_attention_layernorm", &nn::LlamaDecoderLayer::post_attention_layernorm,
                   nb::rv_policy::reference_internal, "The norm before the MLP.")
      .def_prop_ro("mlp", &nn::LlamaDecoderLayer::mlp, nb::rv_policy::reference_internal,
                   "The MLP.");

  nb::class_<nn::Llama, nn::Module>(
      m, "Llama",
      "A Llama-style decoder (nn/llama.h) with Hugging Face's parameter names "
      "(model.embed_tokens.weight, model.layers.{i}..., lm_head.weight).")
      .def(
          "__init__",
          [](nn::Llama* self, const LlamaConfig& config, DeviceArg device, DType dtype,
             Generator* gen) { new (self) nn::Llama(config, param_options(device, dtype, gen)); },
          nb::arg("config"), ACCRUE_PARAM_KWARGS,
          "Initialized as transformers' (Note [Llama initialization]) from `generator`.")
      .def_static(
          "from_hf",
          [](const std::string& dir, DeviceArg device, DType dtype, bool activation_checkpointing) {
            return nn::Llama::from_hf(dir, param_options(device, dtype, nullptr),
                                      activation_checkpointing);
          },
          nb::arg("dir"), nb::kw_only(), nb::arg("device") = "cpu", nb::arg("dtype") = DType::f32,
          nb::arg("activation_checkpointing") = false,
          "A model built from dir/config.json with dir's safetensors weights (cast to dtype on "
          "device).")
      .def("load_hf", &nn::Llama::load_hf, nb::arg("dir"),
           "Loads dir's weights into this model; dir's config must describe this architecture.")
      .def("save_hf", &nn::Llama::save_hf, nb::arg("dir"),
           nb::arg("max_shard_bytes") = nn::kDefaultMaxShardBytes,
           "Writes config.json and the weights as transformers' save_pretrained does.")
      .def_prop_ro("config", &nn::Llama::config, "The config.")
      .def_prop_ro("device", &nn::Llama::device, "The parameters' device.")
      .def(
          "use_fp8",
          [](nn::Llama& l, const std::string& recipe, DType grad_dtype) {
            return l.use_fp8(fp8_options("Llama.use_fp8", recipe, grad_dtype));
          },
          nb::arg("recipe") = "tensor", nb::arg("grad_dtype") = DType::f8e5m2,
          "The decoder layers' projections in FP8 (Note [FP8 linear]), the output gradients in "
          "grad_dtype (f8e5m2 or f8e4m3), per tensor or per block (recipe 'block'); returns "
          "their weights, for ParamStore.keep_fp8_copies.")
      .def("forward", &nn::Llama::forward, nb::arg("idx"),
           nb::arg("layout") = nn::BatchLayout::full(),
           "idx [B, T] token ids -> the hidden state after the final norm [B, T, hidden].")
      .def("__call__", &nn::Llama::forward, nb::arg("idx"),
           nb::arg("layout") = nn::BatchLayout::full(), "forward(idx, layout).")
      .def("loss", &nn::Llama::loss, nb::arg("idx"), nb::arg("targets"),
           nb::arg("layout") = nn::BatchLayout::full(),
           "The next-token Loss (sum, count) over targets [B, T] (-100 ignored) through the "
           "fused classifier.")
      .def("logits", &nn::Llama::logits, nb::arg("idx"),
           nb::arg("layout") = nn::BatchLayout::full(),
           "[B, T, vocab] logits in the parameters' dtype.")
      .def_prop_ro("num_layers", &nn::Llama::num_layers, "Decoder layers.")
      .def_prop_ro("embed_tokens", &nn::Llama::embed_tokens, "The embedding [vocab, hidden].")
      .def_prop_ro("head_weight", &nn::Llama::head_weight,
                   "lm_head.weight, or the embedding when tied.")
      .def("layer", &nn::Llama::layer, nb::arg("i"), nb::rv_policy::reference_internal,
           "Decoder layer i (model.layers.{i}).")
      .def_prop_ro("norm", &nn::Llama::norm, nb::rv_policy::reference_internal,
                   "The final RMSNorm (model.norm).");

  nb::class_<nn::LlamaKVCache>(m, "LlamaKVCache",
                               "A KV cache for inference with a Llama (Note [Llama KV cache]); "
                               "keeps the model alive.")
      .def(nb::init<const nn::Llama&, int64_t, int64_t>(), nb::arg("model"), nb::arg("batch"),
           nb::arg("max_len"), nb::keep_alive<1, 2>(),
           "Room for max_len tokens (at most max_positions) of `batch` rows.")
      .def("forward", &nn::LlamaKVCache::forward, nb::arg("idx"),
           "idx [B, T] -> logits [B, T, vocab]; appends the T tokens to the cache (no graph).")
      .def("__call__", &nn::LlamaKVCache::forward, nb::arg("idx"), "forward(idx).")
      .def("reset", &nn::LlamaKVCache::reset, "Forgets every cached token.")
      .def_prop_ro("length", &nn::LlamaKVCache::length, "Tokens cached.")
      .def_prop_ro("max_len", &nn::LlamaKVCache::max_len, "Capacity in tokens.")
      .def_prop_ro("batch", &nn::LlamaKVCache::batch, "Rows.")
      .def("keys", &nn::LlamaKVCache::keys, nb::arg("layer"),
           "Layer's keys [B, kv_heads, max_len, head_dim].")
      .def("values", &nn::LlamaKVCache::values, nb::arg("layer"),
           "Layer's values [B, kv_heads, max_len, head_dim].");

  m.def(
      "generate_greedy",
      [](const nn::Llama& model, const std::vector<int64_t>& prompt, int64_t new_tokens,
         bool use_cache, const std::vector<int64_t>& stop_ids) {
        return nn::generate_greedy(model, prompt, new_tokens, use_cache, nullptr, stop_ids);
      },
      nb::arg("model"), nb::arg("prompt"), nb::arg("new_tokens"), nb::arg("use_cache") = true,
      nb::arg("stop_ids") = std::vector<int64_t>{},
      "Greedy generation (Note [Greedy generation]): prompt + up to new_tokens argmax tokens, "
      "stopping after emitting one of stop_ids; transformers' generate(do_sample=False).");
}

}  // namespace accrue::python
