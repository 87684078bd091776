// Attention against PyTorch: every variant of accrue's SdpaOptions (grouped
// and multi-query heads, both causal alignments, a right-padded batch, packed
// documents, a sliding window, an additive bias with its gradient, a boolean
// mask) in f64 on the CPU against F.scaled_dot_product_attention(enable_gqa=
// True) with the equivalent attn_mask, from the fixture make_attention_golden.py
// writes (out, dq, dk, dv and dbias of a random output gradient).
//
// Without the fixture file every test skips and says how to make it.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/tensor_io.h"
#include "tests/test_util.h"

#ifndef ACCRUE_GOLDEN_DIR
#error "ACCRUE_GOLDEN_DIR must name the fixture directory (see tests/golden/CMakeLists.txt)"
#endif

namespace accrue {
namespace {

const std::string kFixture = std::string(ACCRUE_GOLDEN_DIR) + "/attention.safetensors";

// PyTorch and accrue both compute in f64; the orders of their sums differ.
constexpr double kTol = 1e-10;

#define ACCRUE_REQUIRE_ATTENTION_FIXTURE()                                                 \
  do {                                                                                     \
    if (!std::filesystem::is_regular_file(kFixture))                                       \
      GTEST_SKIP() << "no attention golden fixture at " << kFixture                        \
                   << "; generate it with PyTorch: python3 "                               \
                      "tests/golden/make_attention_golden.py --out tests/golden/fixtures"; \
  } while (0)

struct Golden {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
  static const Golden& get() {
    static const Golden g = [] {
      Golden r;
      r.tensors = load_safetensors(kFixture, &r.meta);
      return r;
    }();
    return g;
  }
  const Tensor& at(const std::string& key) const {
    auto it = tensors.find(key);
    ACCRUE_CHECK(it != tensors.end(), kFixture, ": no tensor '", key, "'");
    return it->second;
  }
  bool has(const std::string& key) const { return tensors.count(key) != 0; }
  std::string meta_of(const std::string& key) const {
    auto it = meta.find(key);
    ACCRUE_CHECK(it != meta.end(), kFixture, ": no metadata '", key, "'");
    return it->second;
  }
};

// The options of `c` from its metadata and tensors, the way a user ports the
// PyTorch call (the boolean masks of the generator become accrue's options).
SdpaOptions options_of(const Golden& g, const std::string& c) {
  SdpaOptions o;
  const std::string causal = g.meta_of(c + ".causal");
  if (causal == "top_left") o.causal(MaskAlignment::top_left);
  if (causal == "bottom_right") o.causal(MaskAlignment::bottom_right);
  const int64_t window = std::stoll(g.meta_of(c + ".window"));
  if (window > 0) o.window(window);
  if (g.has(c + ".seq_len_q")) o.seq_lens(g.at(c + ".seq_len_q"), g.at(c + ".seq_len_kv"));
  if (g.has(c + ".cu_seqlens")) o.varlen(g.at(c + ".cu_seqlens"));
  if (g.has(c + ".mask")) o.mask(g.at(c + ".mask"));
  return o;
}

void check_case(const std::string& c) {
  const Golden& g = Golden::get();
  Tensor q = requires_grad_(g.at(c + ".q").clone()), k = requires_grad_(g.at(c + ".k").clone()),
         v = requires_grad_(g.at(c + ".v").clone());
  SdpaOptions o = options_of(g, c);
  Tensor bias;
  if (g.has(c + ".bias")) {
    bias = requires_grad_(g.at(c + ".bias").clone());
    o.bias(bias);
  }
  Tensor out = scaled_dot_product_attention(q, k, v, o);
  backward(sum(mul(out, g.at(c + ".grad_out"))));
  EXPECT_TRUE(test::all_close(detach(out), g.at(c + ".out"), kTol, kTol)) << c << ".out";
  EXPECT_TRUE(test::all_close(grad(q), g.at(c + ".dq"), kTol, kTol)) << c << ".dq";
  EXPECT_TRUE(test::all_close(grad(k), g.at(c + ".dk"), kTol, kTol)) << c << ".dk";
  EXPECT_TRUE(test::all_close(grad(v), g.at(c + ".dv"), kTol, kTol)) << c << ".dv";
  if (bias.defined()) {
    EXPECT_TRUE(test::all_close(grad(bias), g.at(c + ".dbias"), kTol, kTol)) << c << ".dbias";
  }
}

TEST(AttentionGolden, grouped_query_heads_causal) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("gqa");
}

TEST(AttentionGolden, multi_query_heads) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("mqa");
}

TEST(AttentionGolden, causal_top_left_is_pytorch_is_causal) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("causal_top_left");
}

TEST(AttentionGolden, causal_bottom_right_is_tril_shifted) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("causal_bottom_right");
}

TEST(AttentionGolden, right_padded_batch) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("padded");
}

TEST(AttentionGolden, packed_documents) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("varlen");
}

TEST(AttentionGolden, sliding_window) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("window");
}

TEST(AttentionGolden, additive_bias_and_its_gradient) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("bias");
  check_case("bias_batch");
}

TEST(AttentionGolden, boolean_mask) {
  ACCRUE_REQUIRE_ATTENTION_FIXTURE();
  check_case("mask");
}

}  // namespace
}  // namespace accrue
