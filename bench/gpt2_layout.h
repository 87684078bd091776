// GPT-2 124M's parameters as the benchmarks register them: nanoGPT's
// registration order, the vocabulary padded to 50304 (124,475,904 elements).
// Shared by the window-close and the data-parallel benchmarks; the Linear
// shapes of one block by the GEMM benchmarks.
#pragma once

#include <string>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue::bench {

struct ParamSpec {
  std::string name;
  Shape shape;
};

// The Linear layers of a GPT-2 124M block (and the tied logits), weight [out, in].
struct LinearShape {
  const char* layer;
  int64_t out, in;
};
inline constexpr LinearShape kGpt2Linears[] = {
    {"qkv", 2304, 768}, {"proj", 768, 768},     {"fc", 3072, 768},
    {"fc2", 768, 3072}, {"logits", 50304, 768},
};

inline std::vector<ParamSpec> gpt2_124m() {
  constexpr int64_t kVocab = 50304, kContext = 1024, kWidth = 768, kLayers = 12;
  std::vector<ParamSpec> p = {{"wte", {kVocab, kWidth}}, {"wpe", {kContext, kWidth}}};
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    p.push_back({h + "ln_1.weight", {kWidth}});
    p.push_back({h + "ln_1.bias", {kWidth}});
    p.push_back({h + "attn.c_attn.weight", {3 * kWidth, kWidth}});
    p.push_back({h + "attn.c_attn.bias", {3 * kWidth}});
    p.push_back({h + "attn.c_proj.weight", {kWidth, kWidth}});
    p.push_back({h + "attn.c_proj.bias", {kWidth}});
    p.push_back({h + "ln_2.weight", {kWidth}});
    p.push_back({h + "ln_2.bias", {kWidth}});
    p.push_back({h + "mlp.c_fc.weight", {4 * kWidth, kWidth}});
    p.push_back({h + "mlp.c_fc.bias", {4 * kWidth}});
    p.push_back({h + "mlp.c_proj.weight", {kWidth, 4 * kWidth}});
    p.push_back({h + "mlp.c_proj.bias", {kWidth}});
  }
  p.push_back({"ln_f.weight", {kWidth}});
  p.push_back({"ln_f.bias", {kWidth}});
  return p;
}

}  // namespace accrue::bench
