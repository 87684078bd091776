// Greedy generation from a Hugging Face Llama / Qwen3 directory (config.json
// and safetensors, sharded or not) with a KV cache (Note [Llama KV cache],
// Note [Greedy generation] in nn/llama_generate.h): a quick check that a
// checkpoint loaded right. The prompt is token ids (no tokenizer); the
// generated ids are printed, comma-separated, on the line "generated: ...".
// On the tiny transformers-written fixtures the tokens equal transformers'
// generate(do_sample=False) (tests/nn/llama_generate_test.cpp).
// `accrue_generate --help` lists the options.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "accrue.h"
#include "examples/common/launch.h"
#include "examples/common/options.h"
#include "examples/common/run_main.h"

using namespace accrue;
using namespace accrue::examples;

namespace {

constexpr const char* kProgram = "accrue_generate";

struct Options {
  std::string model, prompt_text, stop_text;
  std::vector<int64_t> prompt, stop_ids;
  int64_t new_tokens = 16;
  DType dtype = DType::f32;
  bool no_cache = false, force_cpu = false, stop_at_eos = false;
};

// "1,2,3": base-10 ids >= 0, comma-separated, nothing else (Note
// [Command-line values]).
std::vector<int64_t> parse_ids(const char* option, const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(',', start);
    const std::string item = text.substr(start, end == std::string::npos ? end : end - start);
    bool digits = !item.empty() && item.size() <= 18;
    for (char ch : item)
      digits = digits && ch >= '0' && ch <= '9';
    if (!digits)
      usage_error(option, " expects comma-separated token ids (integers >= 0), got '", text,
                  "' (bad item '", item, "')");
    ids.push_back(std::stoll(item));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return ids;
}

bool parse(int argc, char** argv, Options& o) {
  OptionTable cli(kProgram,
                  "Loads a Hugging Face LlamaForCausalLM / Qwen3ForCausalLM directory and "
                  "greedily generates tokens after a prompt of token ids, with a KV cache.");
  cli.path("--model", &o.model, "DIR",
           "the checkpoint directory (config.json + model.safetensors or shards); hf:DIR "
           "is accepted too")
      .default_text("required");
  cli.text("--prompt-ids", &o.prompt_text, "IDS",
           "the prompt as comma-separated token ids, e.g. 1,2,3")
      .default_text("required");
  cli.integer("--new-tokens", &o.new_tokens, "N", "tokens to generate").min(1);
  cli.choice<DType>("--dtype", &o.dtype,
                    {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f64", DType::f64}},
                    "the weights' and the computation's dtype");
  cli.flag("--stop-at-eos", &o.stop_at_eos,
           "stop after an end-of-sequence id of config.json (eos_token_id), as transformers' "
           "generate does by default");
  cli.text("--stop-ids", &o.stop_text, "IDS", "stop after any of these comma-separated ids")
      .default_text("none");
  cli.flag("--no-cache", &o.no_cache,
           "rerun the whole sequence for every token (the reference the cache is checked against)");
  cli.flag("--cpu", &o.force_cpu, "run on the CPU even when a GPU is present");
  cli.epilog(
      "Example:\n  accrue_generate --model tests/nn/fixtures/hf_llama_tiny --prompt-ids 1,17,42 "
      "--new-tokens 8 --cpu\n"
      "Prints the generated ids on the line \"generated: ...\". Without --stop-at-eos or "
      "--stop-ids every one of the N tokens is generated.");
  if (!cli.parse(argc, argv)) return false;
  if (o.model.rfind("hf:", 0) == 0) o.model = o.model.substr(3);
  if (o.model.empty()) usage_error("--model DIR is required");
  if (o.prompt_text.empty()) usage_error("--prompt-ids is required");
  o.prompt = parse_ids("--prompt-ids", o.prompt_text);
  if (!o.stop_text.empty()) o.stop_ids = parse_ids("--stop-ids", o.stop_text);
  return true;
}

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(ids[i]));
  }
  return s;
}

int run(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, opt)) return 0;
  const Device device = single_device(opt.force_cpu);
  auto model = nn::Llama::from_hf(opt.model, {device, opt.dtype});
  const nn::LlamaConfig& c = model->config();
  // Values that only the checkpoint's config can judge, refused as a bad
  // command line naming the option.
  for (size_t t = 0; t < opt.prompt.size(); ++t)
    if (opt.prompt[t] >= c.vocab_size)
      usage_error("--prompt-ids: token ", t, " = ", opt.prompt[t],
                  " is outside the vocabulary [0, ", c.vocab_size, ") of ", opt.model);
  for (size_t t = 0; t < opt.stop_ids.size(); ++t)
    if (opt.stop_ids[t] >= c.vocab_size)
      usage_error("--stop-ids: id ", t, " = ", opt.stop_ids[t], " is outside the vocabulary [0, ",
                  c.vocab_size, ") of ", opt.model);
  if (opt.stop_at_eos) {
    if (c.eos_token_ids.empty())
      usage_error("--stop-at-eos: ", opt.model, "/config.json names no eos_token_id");
    opt.stop_ids.insert(opt.stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
  }
  const int64_t P = static_cast<int64_t>(opt.prompt.size());
  if (opt.new_tokens > c.max_positions || P > c.max_positions - opt.new_tokens + 1)
    usage_error("--prompt-ids (", P, " tokens) and --new-tokens ", opt.new_tokens, " need ", P,
                " + ", opt.new_tokens,
                " - 1 positions, more than max_position_embeddings = ", c.max_positions, " of ",
                opt.model);
  std::printf(
      "%s on %s: %s, %lld layers, %lld query / %lld kv heads, hidden %lld, vocab %lld, %s, %s\n",
      kProgram, device.str().c_str(), c.model_type.c_str(), (long long)c.layers, (long long)c.heads,
      (long long)c.kv_heads, (long long)c.hidden, (long long)c.vocab_size, dtype_name(opt.dtype),
      opt.no_cache ? "no cache" : "KV cache");
  std::printf("prompt: %s\n", join(opt.prompt).c_str());
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> out =
      nn::generate_greedy(*model, opt.prompt, opt.new_tokens, !opt.no_cache, nullptr, opt.stop_ids);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("generated: %s\n", join(out).c_str());
  const int64_t n = static_cast<int64_t>(out.size());
  std::printf("%lld tokens in %.3f s (%.1f tokens/s, prefill included)%s\n", (long long)n, s,
              static_cast<double>(n) / s, n < opt.new_tokens ? ", stopped at a stop id" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(kProgram, [&] { return run(argc, argv); });
}
