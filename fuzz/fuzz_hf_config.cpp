// libFuzzer target: the JSON of Hugging Face checkpoint directories
// (Note [Schema-driven JSON]): the input as a config.json
// (nn::parse_hf_config, and nn::hf_model_type, which picks the family) and as
// a model.safetensors.index.json
// (nn::parse_safetensors_index). A malformed text must throw accrue::Error,
// never crash, recurse without bound or trip UBSan. A config it accepts is
// valid, and what write_hf_config makes of it reads back as the same config;
// an index it accepts names only plain .safetensors files in the directory
// (Note [Checkpoint directories]).
#include <string>

#include "accrue/core/error.h"
#include "accrue/nn/hf_checkpoint.h"
#include "accrue/nn/llama_config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accrue;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nn::LlamaConfig config = nn::parse_hf_config(text, "config.json");
    config.validate();  // must not throw: the reader validated it
    fuzz::require(config.parameter_count() > 0, "an accepted config has no parameters");
    const nn::LlamaConfig again = nn::parse_hf_config(nn::hf_config_json(config), "again.json");
    fuzz::require(again == config, "a config changed in a write/read round trip");
  } catch (const Error&) {
  }
  try {
    nn::hf_model_type(text, "config.json");
  } catch (const Error&) {
  }
  try {
    for (const auto& [tensor, shard] : nn::parse_safetensors_index(text, "index.json")) {
      fuzz::require(!shard.empty() && shard.find('/') == std::string::npos &&
                        shard.find('\\') == std::string::npos &&
                        shard.find('\0') == std::string::npos && shard != "." && shard != ".." &&
                        shard.ends_with(".safetensors"),
                    "an accepted index names a shard outside the directory");
    }
  } catch (const Error&) {
  }
  return 0;
}
