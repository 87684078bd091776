// Hugging Face GPT-2 checkpoints (transformers' GPT2LMHeadModel as
// model.safetensors) to and from nn::GPT2.
//
// HF keeps GPT-2's original Conv1D layout for the four projection weights,
// [in, out], where accrue (like nn.Linear) has [out, in]: c_attn [C, 3C],
// attn.c_proj [C, C], mlp.c_fc [C, 4C], mlp.c_proj [4C, C] are transposed
// both ways. wte has vocab_size rows in the file and padded_vocab rows in the
// model (zeros on load, dropped on save). Names are prefixed "transformer."
// (a file whose names all lack the prefix, as GPT2Model saves them, loads
// too); lm_head.weight is tied to wte, so a file may hold it only as a copy
// of wte, and save leaves it out. The causal-mask buffers that older files
// carry, transformer.h.{i}.attn.bias and transformer.h.{i}.attn.masked_bias,
// are not parameters and are ignored.
//
// Loading and saving go through each parameter's owner when an
// optim::ParamStore holds the model (Note [One load path]): load writes the
// master weights and then the compute copy, so it may come before or after
// the store is built; save writes the master weights, not a 16-bit compute
// copy. Optimizer moments are not touched.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/nn/gpt2.h"

namespace accrue::nn {

// One tensor of an HF GPT-2 file and the accrue parameter it holds.
struct HFTensor {
  std::string hf_name;      // "transformer.h.0.attn.c_attn.weight"
  std::string param_name;   // "h.0.attn.c_attn.weight"
  Shape hf_shape;           // as stored in the file ([C, 3C])
  Shape param_shape;        // as in the model ([3C, C])
  bool transposed = false;  // Conv1D: the file holds the parameter's transpose
};

// Every tensor an HF file for `config` holds, in accrue's parameter order.
std::vector<HFTensor> hf_gpt2_tensors(const GPT2Config& config);

// Whether `name` is one of the ignored buffers: transformer.h.{i}.attn.bias or
// transformer.h.{i}.attn.masked_bias (with or without "transformer.").
bool is_hf_gpt2_buffer(const std::string& name);

// A file's tensors as accrue parameters, by parameter name, in the file's
// dtype on the CPU: Conv1D weights transposed, wte padded with zero rows.
// Throws accrue::Error naming the tensor for a missing, unexpected or
// misshapen tensor (expected vs found shape), a layer count that differs from
// config.n_layer, or an lm_head.weight that is not wte.
std::map<std::string, Tensor> params_from_hf_gpt2(const GPT2Config& config,
                                                  const std::map<std::string, Tensor>& hf);

// The reverse: named parameters (as GPT2::named_parameters gives them) to HF
// names and layouts, contiguous on the CPU in the parameters' dtype; padded
// rows dropped, no lm_head.weight.
std::map<std::string, Tensor> params_to_hf_gpt2(const GPT2Config& config,
                                                const std::vector<NamedParameter>& params);

// Copies the file's weights into the model's parameters in place (Note [One
// load path]).
void load_hf_gpt2(GPT2& model, const std::string& safetensors_path);
// Writes the model's parameters (their master weights) as an HF GPT-2 safetensors file.
void save_hf_gpt2(const GPT2& model, const std::string& path);

// The GPT2Config of a transformers GPT-2 config.json (model_type "gpt2"):
// n_layer, n_head, n_embd, vocab_size, n_positions (block_size; the older
// n_ctx where it is absent, and the two must agree where both are there),
// layer_norm_epsilon. What accrue's GPT-2 cannot be is refused naming the
// key: an activation other than the tanh GELU ("gelu_new",
// "gelu_pytorch_tanh"), n_inner other than 4 * n_embd, unscaled attention or
// attention scaled by the layer index, cross-attention, an untied head, a
// quantized checkpoint. The dropouts and the other keys (architectures,
// task_specific_params, ...) are ignored: dropout is the trainer's option.
// `name` names the file in errors.
GPT2Config parse_hf_gpt2_config(const std::string& text, const std::string& name);
GPT2Config read_hf_gpt2_config(const std::string& path);

// A GPT-2 built from dir/config.json with the weights of dir/model.safetensors
// (load_hf_gpt2), its parameters in `options`; the config as read, with
// activation checkpointing as asked.
std::unique_ptr<GPT2> gpt2_from_hf(const std::string& dir, const ParamOptions& options,
                                   bool activation_checkpointing = false);

}  // namespace accrue::nn
