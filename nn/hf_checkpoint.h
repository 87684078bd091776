// Hugging Face checkpoint directories: the weights as one model.safetensors,
// or sharded as transformers' save_pretrained writes them
// (model-00001-of-00003.safetensors ... and model.safetensors.index.json,
// whose "weight_map" names the shard of every tensor).
//
//   std::map<std::string, Tensor> w = nn::load_safetensors_dir("Llama-3.2-1B");
//   nn::save_safetensors_dir("out", ordered_tensors, 5'000'000'000);
//
// Every shard is read by load_safetensors (Note [Untrusted tensor files],
// Note [Tensor checksums]) and the index is untrusted too (Note [Checkpoint
// directories]). Depends on core alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/error.h"
#include "accrue/core/tensor.h"

namespace accrue::nn {

// transformers' default max_shard_size ("5GB", 5 * 10^9 bytes).
constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// The tensors of a checkpoint directory: model.safetensors, or the shards
// model.safetensors.index.json lists (a directory holding both, or neither,
// is refused). With `sources`, each tensor's file path is recorded there, for
// errors that name the file a tensor came from. Throws accrue::Error naming
// the file and the tensor for an index that is not JSON of the expected
// shape, a shard name that is not a plain file name, a missing shard, a
// tensor in two shards, a tensor the index puts in another shard than the one
// holding it, or a listed tensor no shard holds.
std::map<std::string, Tensor> load_safetensors_dir(const std::string& dir,
                                                   std::map<std::string, std::string>* sources);
std::map<std::string, Tensor> load_safetensors_dir(const std::string& dir);

// Writes `tensors` into `dir` (created if missing) as save_pretrained does:
// in the given order, a tensor goes to the current shard unless that would
// take it past max_shard_bytes, when a new shard starts (a tensor larger than
// the limit gets a shard of its own). One shard is written as
// model.safetensors; several as model-0000i-of-0000n.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {...}}, sorted keys, two-space indent). Each shard carries
// `metadata` (transformers expects {"format": "pt"}) and accrue's checksums.
// Stale files of the other layout (an index, shards, or model.safetensors
// left by an earlier save) are removed so the directory loads unambiguously.
void save_safetensors_dir(const std::string& dir,
                          const std::vector<std::pair<std::string, Tensor>>& tensors,
                          int64_t max_shard_bytes = kDefaultMaxShardBytes,
                          const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// The text of a config.json at `path` (up to 16 MB: configs are kilobytes,
// id2label tables more), refused naming `op` and the file when missing,
// unreadable or larger.
std::string read_hf_config_text(const std::string& path, const char* op);

// A config.json's "model_type" ("" when it has none), read from its
// top-level keys alone; `name` names the file in errors (not a JSON object,
// model_type not a string).
std::string hf_model_type(const std::string& text, const std::string& name);

// c (a config parsed from `file`: its path, or what prints it) after
// c.validate(), whose refusal is rethrown naming the file.
template <class Config, class File>
Config validated_hf_config(Config c, const File& file) {
  try {
    c.validate();
  } catch (const Error& e) {
    ACCRUE_FAIL(file, ": ", e.message());
  }
  return c;
}

// A shard size as transformers' max_shard_size takes it: a byte count, or a
// number with a unit, decimal (KB, MB, GB: powers of 10) or binary (KiB,
// MiB, GiB: powers of 2): "5GB" = 5 * 10^9, "50KB" = 50000, "2GiB" =
// 2 * 2^30; as in transformers, a decimal unit ending in a lowercase b
// counts bits ("8Gb" = 10^9), and units are otherwise case-insensitive. Throws accrue::Error naming
// the text for anything else, a size below 1 byte, or one that overflows int64.
int64_t parse_shard_size(const std::string& text);

// The weight_map of an index's text: tensor name -> shard file name, with
// the checks of load_safetensors_dir that need no file. `name` stands for
// the file in errors.
std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& name);

}  // namespace accrue::nn
