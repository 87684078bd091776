// Greedy generation with nn::LlamaKVCache (Note [Llama KV cache], Note
// [Greedy generation]): the cache against rerunning the whole sequence, a
// prefill in pieces against one, the tokens against transformers'
// generate(do_sample=False) on the tiny transformers-written fixtures
// (fixtures/generate_golden.txt, made by fixtures/make_generate_fixtures.py),
// and bad inputs.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/nn/llama.h"
#include "accrue/nn/llama_generate.h"
#include "tests/nn/generate_golden.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::fixture;
using test::GoldenCase;
using test::read_goldens;

std::unique_ptr<nn::Llama> load(const std::string& dir, DType dtype) {
  return nn::Llama::from_hf(fixture(dir), {Device::cpu(), dtype});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> y = b.to(DType::f64).contiguous().to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

TEST(LlamaGenerate, GoldensAreRead) {
  const std::vector<GoldenCase> cases = read_goldens();
  ASSERT_EQ(cases.size(), 6u);
  for (const GoldenCase& c : cases) {
    EXPECT_EQ(static_cast<int64_t>(c.tokens.size()), c.new_tokens) << c.name;
    EXPECT_EQ(static_cast<int64_t>(c.first_logits.size()),
              load(c.dir, DType::f32)->config().vocab_size)
        << c.name;
    // Far from a tie: float32 picks the same tokens as float64.
    EXPECT_GT(c.gap, 1e-3) << c.name;
  }
}

// The cache's tokens and every step's logits equal rerunning the whole
// sequence through Llama::logits, in float64.
TEST(LlamaGenerate, CacheMatchesNoCache) {
  for (const GoldenCase& c : read_goldens()) {
    SCOPED_TRACE(c.name);
    auto model = load(c.dir, DType::f64);
    std::vector<Tensor> cached, plain;
    const std::vector<int64_t> a =
        nn::generate_greedy(*model, c.prompt, c.new_tokens, true, &cached);
    const std::vector<int64_t> b =
        nn::generate_greedy(*model, c.prompt, c.new_tokens, false, &plain);
    EXPECT_EQ(a, b);
    ASSERT_EQ(cached.size(), static_cast<size_t>(c.new_tokens));
    ASSERT_EQ(plain.size(), cached.size());
    for (size_t n = 0; n < cached.size(); ++n) {
      EXPECT_EQ(cached[n].shape(), (Shape{model->config().vocab_size}));
      EXPECT_LE(max_abs_diff(cached[n], plain[n]), 1e-12) << "step " << n;
    }
  }
}

// A prefill in pieces (3 tokens, then 1, then 4) of two rows gives the logits
// of one causal forward over the whole sequence: the bottom-right mask lets
// each new query see the cached past and the new tokens before it.
TEST(LlamaGenerate, PrefillInPiecesMatchesForward) {
  for (const char* dir : {"hf_llama_tiny", "hf_qwen3_tiny"}) {
    SCOPED_TRACE(dir);
    auto model = load(dir, DType::f64);
    const std::vector<int64_t> ids = {3, 14, 15, 92, 65, 35, 89, 79,   // row 0
                                      2, 71, 82, 81, 82, 8,  45, 90};  // row 1
    const Tensor idx = from_vector<int64_t>(ids, {2, 8}, DType::i64);
    Tensor expected;
    {
      NoGradGuard no_grad;
      expected = model->logits(idx);
    }
    nn::LlamaKVCache cache(*model, 2, 10);
    std::vector<Tensor> pieces;
    int64_t start = 0;
    for (int64_t len : {3, 1, 4}) {
      pieces.push_back(cache.forward(idx.narrow(1, start, len).contiguous()));
      start += len;
      EXPECT_EQ(cache.length(), start);
    }
    EXPECT_EQ(cache.keys(0).shape(),
              (Shape{2, model->config().kv_heads, 10, model->config().head_dim}));
    start = 0;
    for (const Tensor& p : pieces) {
      EXPECT_LE(max_abs_diff(p, expected.narrow(1, start, p.size(1))), 1e-12);
      start += p.size(1);
    }
    cache.reset();
    EXPECT_EQ(cache.length(), 0);
    EXPECT_LE(max_abs_diff(cache.forward(idx), expected), 1e-12);
  }
}

// The tokens of transformers' model.generate(input_ids, do_sample=False,
// max_new_tokens=N), token for token, and its first step's logits, in float64
// (1e-12) and float32 (1e-5 relative to the largest logit: the weights are
// float32 values, the sums are not). The fixtures run from 8 to 60 new
// tokens; hf_llama_gen and hf_qwen3_gen (single-file, weights of std 0.25)
// generate varied tokens, end-of-sequence ids included, over positions past
// llama3's original 32.
TEST(LlamaGenerate, MatchesTransformersGenerate) {
  for (const GoldenCase& c : read_goldens()) {
    for (DType dtype : {DType::f64, DType::f32}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      auto model = load(c.dir, dtype);
      std::vector<Tensor> logits;
      EXPECT_EQ(nn::generate_greedy(*model, c.prompt, c.new_tokens, true, &logits), c.tokens);
      ASSERT_FALSE(logits.empty());
      const int64_t V = static_cast<int64_t>(c.first_logits.size());
      const Tensor golden = from_vector<double>(c.first_logits, {V}, DType::f64);
      double scale = 1.0;
      for (double v : c.first_logits)
        scale = std::max(scale, std::abs(v));
      EXPECT_LE(max_abs_diff(logits[0], golden), (dtype == DType::f64 ? 1e-12 : 1e-5) * scale);
      EXPECT_EQ(nn::generate_greedy(*model, c.prompt, c.new_tokens, false), c.tokens);
    }
  }
}

// With the config's eos ids as stop ids, transformers' default generate: the
// tokens up to and including the first eos (hf_llama_gen stops after 52 of
// 60), or all N when none comes.
TEST(LlamaGenerate, StopIdsMatchTransformersEos) {
  bool stopped_early = false;
  for (const GoldenCase& c : read_goldens()) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.eos_ids.empty());
    auto model = load(c.dir, DType::f64);
    for (bool cache : {true, false})
      EXPECT_EQ(nn::generate_greedy(*model, c.prompt, c.new_tokens, cache, nullptr, c.eos_ids),
                c.stopped);
    stopped_early = stopped_early || static_cast<int64_t>(c.stopped.size()) < c.new_tokens;
  }
  EXPECT_TRUE(stopped_early);
}

TEST(LlamaGenerate, RefusesBadInputs) {
  auto model = load("hf_llama_tiny", DType::f32);  // vocab 128, 256 positions
  EXPECT_ERROR(nn::generate_greedy(*model, {1, 2}, 0), "generate_greedy", "new_tokens = 0", ">= 1");
  EXPECT_ERROR(nn::generate_greedy(*model, {1, 2}, -3), "new_tokens = -3");
  EXPECT_ERROR(nn::generate_greedy(*model, {}, 4), "generate_greedy", "prompt is empty");
  EXPECT_ERROR(nn::generate_greedy(*model, {1, 128, 3}, 4), "generate_greedy",
               "prompt token 1 = 128", "[0, 128)");
  EXPECT_ERROR(nn::generate_greedy(*model, {-1}, 4), "prompt token 0 = -1");
  EXPECT_ERROR(nn::generate_greedy(*model, {1}, 4, true, nullptr, {2, 200}), "generate_greedy",
               "stop id 1 = 200", "[0, 128)");
  const std::vector<int64_t> long_prompt(300, 7);
  EXPECT_ERROR(nn::generate_greedy(*model, long_prompt, 1), "generate_greedy", "300 tokens",
               "max_position_embeddings = 256");
  // 250 + 8 - 1 = 257 positions: one too many; 250 + 7 - 1 = 256 fits.
  const std::vector<int64_t> near(250, 7);
  EXPECT_ERROR(nn::generate_greedy(*model, near, 8), "250 tokens and 8 new tokens",
               "max_position_embeddings = 256");
  EXPECT_ERROR(nn::generate_greedy(*model, {1}, int64_t{1} << 62), "max_position_embeddings = 256");

  EXPECT_ERROR(nn::LlamaKVCache(*model, 0, 8), "LlamaKVCache", "batch 0");
  EXPECT_ERROR(nn::LlamaKVCache(*model, 1, 257), "LlamaKVCache", "max_len 257",
               "max_position_embeddings = 256");
  nn::LlamaKVCache cache(*model, 1, 4);
  EXPECT_ERROR(cache.forward(from_vector<int64_t>({1, 2, 3, 4, 5}, {1, 5}, DType::i64)),
               "LlamaKVCache::forward", "5 tokens after the 0 cached exceed max_len = 4");
  EXPECT_ERROR(cache.forward(from_vector<int64_t>({1, 2}, {2, 1}, DType::i64)),
               "LlamaKVCache::forward", "[B = 1, T >= 1]", "[2, 1]");
  EXPECT_ERROR(cache.forward(from_vector<float>({1, 2}, {1, 2}, DType::f32)), "i32 or i64", "f32");
  EXPECT_EQ(cache.length(), 0);
  EXPECT_ERROR(cache.keys(2), "LlamaKVCache::keys", "layer 2 of 2");
}

}  // namespace
}  // namespace accrue
