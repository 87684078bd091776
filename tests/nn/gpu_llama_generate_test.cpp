// Greedy generation with nn::LlamaKVCache on CUDA (Note [Llama KV cache]):
// on the tiny transformers-written fixtures, f32 (TF32 off) gives
// transformers' tokens (fixtures/generate_golden.txt) and every step's logits
// near the CPU float64 ones; a prefill in pieces of two rows equals one causal
// forward; bf16's first logits stay near float64's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "accrue/core/grad_mode.h"
#include "accrue/nn/llama.h"
#include "accrue/nn/llama_generate.h"
#include "tests/nn/generate_golden.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

using test::fixture;
using test::GoldenCase;
using test::read_goldens;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> y = b.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

TEST(GpuLlamaGenerate, F32MatchesTransformersAndCpu) {
  ACCRUE_REQUIRE_CUDA();
  test::Tf32Scope tf32(false);
  const std::vector<GoldenCase> cases = read_goldens();
  ASSERT_EQ(cases.size(), 6u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto cpu = nn::Llama::from_hf(fixture(c.dir), {Device::cpu(), DType::f64});
    auto gpu = nn::Llama::from_hf(fixture(c.dir), {kGpu, DType::f32});
    std::vector<Tensor> ref, cached, plain;
    nn::generate_greedy(*cpu, c.prompt, c.new_tokens, false, &ref);
    EXPECT_EQ(nn::generate_greedy(*gpu, c.prompt, c.new_tokens, true, &cached), c.tokens);
    EXPECT_EQ(nn::generate_greedy(*gpu, c.prompt, c.new_tokens, false, &plain), c.tokens);
    ASSERT_EQ(cached.size(), ref.size());
    ASSERT_EQ(plain.size(), ref.size());
    // f32 logits against the f64 CPU model: a few units of f32 rounding
    // (6e-8) times the logits' size times the depth of the sums; 1.2e-5 was
    // the worst seen on an H200, the tolerance leaves 4x room.
    constexpr double kF32Logits = 5e-5;
    double worst = 0;
    for (size_t n = 0; n < ref.size(); ++n) {
      EXPECT_EQ(cached[n].device(), kGpu);
      const double dc = max_abs_diff(cached[n], ref[n]), dp = max_abs_diff(plain[n], ref[n]);
      EXPECT_LE(dc, kF32Logits) << "step " << n;
      EXPECT_LE(dp, kF32Logits) << "step " << n;
      worst = std::max({worst, dc, dp});
    }
    std::printf("[gpu generate] %s: worst f32 logit difference from the f64 CPU %.3g\n",
                c.name.c_str(), worst);
  }
}

TEST(GpuLlamaGenerate, PrefillInPiecesMatchesForward) {
  ACCRUE_REQUIRE_CUDA();
  test::Tf32Scope tf32(false);
  for (const char* dir : {"hf_llama_tiny", "hf_qwen3_tiny"}) {
    SCOPED_TRACE(dir);
    auto model = nn::Llama::from_hf(fixture(dir), {kGpu, DType::f32});
    const std::vector<int64_t> ids = {3, 14, 15, 92, 65, 35, 89, 79,   // row 0
                                      2, 71, 82, 81, 82, 8,  45, 90};  // row 1
    const Tensor idx = from_vector<int64_t>(ids, {2, 8}, DType::i64, kGpu);
    Tensor expected;
    {
      NoGradGuard no_grad;
      expected = model->logits(idx);
    }
    nn::LlamaKVCache cache(*model, 2, 12);
    EXPECT_EQ(cache.keys(1).device(), kGpu);
    int64_t start = 0;
    for (int64_t len : {3, 1, 4}) {
      const Tensor piece = cache.forward(idx.narrow(1, start, len).contiguous());
      EXPECT_LE(max_abs_diff(piece, expected.narrow(1, start, len)), 1e-5) << "from " << start;
      start += len;
    }
    EXPECT_EQ(cache.length(), 8);
  }
}

TEST(GpuLlamaGenerate, Bf16FirstLogitsNearF64) {
  ACCRUE_REQUIRE_CUDA();
  for (const GoldenCase& c : read_goldens()) {
    SCOPED_TRACE(c.name);
    auto cpu = nn::Llama::from_hf(fixture(c.dir), {Device::cpu(), DType::f64});
    auto gpu = nn::Llama::from_hf(fixture(c.dir), {kGpu, DType::bf16});
    std::vector<Tensor> ref, got;
    nn::generate_greedy(*cpu, c.prompt, 1, true, &ref);
    nn::generate_greedy(*gpu, c.prompt, 1, true, &got);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].dtype(), DType::bf16);
    // bf16 keeps 8 bits (a relative 4e-3 per rounding): 5e-2 of the largest logit.
    const std::vector<double> r = ref[0].contiguous().to_vector<double>();
    double scale = 1.0;
    for (double v : r)
      scale = std::max(scale, std::abs(v));
    EXPECT_LE(max_abs_diff(got[0], ref[0]), 5e-2 * scale);
  }
}

}  // namespace
}  // namespace accrue
