// scaled_dot_product_attention and packed_causal_attention
// (autograd/transformer_ops.h, autograd/attention_ops.h): float64 gradchecks
// of q, k, v (causal, non-causal, Tq != Tk, dropout with a fixed generator),
// of every research-model variant (grouped-query heads, both causal
// alignments, padded batches, packed documents, a sliding window, a
// differentiable bias, a boolean mask) and of the packed form; the
// generator's counters; bad inputs.
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "accrue/autograd/attention_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/philox.h"
#include "accrue/kernels/attention.h"
#include "accrue/optim/param_store.h"
#include "accrue/optim/verify.h"
#include "accrue/optim/window.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

using test::leaf;

Fn sdpa(bool causal, std::optional<double> scale = std::nullopt) {
  return [=](const std::vector<Tensor>& x) {
    AttentionOptions o;
    o.causal = causal;
    o.scale = scale;
    return scaled_dot_product_attention(x[0], x[1], x[2], o);
  };
}

TEST(AttentionGradcheck, full_attention_with_tq_different_from_tk) {
  EXPECT_GRADCHECK(sdpa(false), leaf({2, 2, 3, 4}), leaf({2, 2, 5, 4}), leaf({2, 2, 5, 3}));
  EXPECT_GRADCHECK(sdpa(false), leaf({1, 2, 5, 3}), leaf({1, 2, 2, 3}), leaf({1, 2, 2, 4}));
}

TEST(AttentionGradcheck, causal_square_and_bottom_right) {
  EXPECT_GRADCHECK(sdpa(true), leaf({2, 2, 4, 3}), leaf({2, 2, 4, 3}), leaf({2, 2, 4, 3}));
  EXPECT_GRADCHECK(sdpa(true), leaf({1, 2, 3, 4}), leaf({1, 2, 5, 4}), leaf({1, 2, 5, 2}));
}

TEST(AttentionGradcheck, explicit_scale) {
  EXPECT_GRADCHECK(sdpa(true, 0.8), leaf({1, 3, 4, 2}), leaf({1, 3, 4, 2}), leaf({1, 3, 4, 2}));
}

TEST(AttentionGradcheck, only_some_inputs_require_grad) {
  Tensor k = test::random_normal({1, 2, 4, 3}, DType::f64);
  EXPECT_GRADCHECK(sdpa(true), leaf({1, 2, 4, 3}), k, leaf({1, 2, 4, 3}));
}

// Each call makes a generator at the same state, so every evaluation of the
// gradcheck (the analytic one and each finite difference) draws the same mask.
TEST(AttentionGradcheck, dropout_with_a_fixed_generator) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Fn f = [causal](const std::vector<Tensor>& x) {
      Generator gen(42);
      AttentionOptions o;
      o.causal = causal;
      o.dropout_p = 0.3;
      o.generator = &gen;
      return scaled_dot_product_attention(x[0], x[1], x[2], o);
    };
    EXPECT_GRADCHECK(f, leaf({2, 2, 4, 3}), leaf({2, 2, 5, 3}), leaf({2, 2, 5, 2}));
  }
}

TEST(AttentionGradcheck, packed_causal_attention) {
  const int64_t n_head = 2;
  Fn f = [](const std::vector<Tensor>& x) { return packed_causal_attention(x[0], n_head); };
  EXPECT_GRADCHECK(f, leaf({2, 4, 3 * n_head * 3}));
  // A strided qkv (every other row of a larger buffer) goes in as views too.
  Fn strided = [](const std::vector<Tensor>& x) {
    return packed_causal_attention(narrow(x[0], 2, 0, 3 * n_head * 2), n_head);
  };
  EXPECT_GRADCHECK(strided, leaf({1, 3, 3 * n_head * 2 + 5}));
  Fn with_dropout = [](const std::vector<Tensor>& x) {
    Generator gen(7);
    AttentionOptions o;
    o.dropout_p = 0.25;
    o.generator = &gen;
    return packed_causal_attention(x[0], n_head, o);
  };
  EXPECT_GRADCHECK(with_dropout, leaf({1, 5, 3 * n_head * 2}));
}

// The packed form is sdpa on the head views of qkv, with [B, T, H * d] out.
TEST(AttentionGradcheck, packed_equals_sdpa_on_the_head_views) {
  const int64_t B = 2, T = 5, H = 3, d = 2, C = H * d;
  Tensor qkv = leaf({B, T, 3 * C});
  Tensor packed = packed_causal_attention(qkv, H);
  ASSERT_EQ(packed.shape(), (Shape{B, T, C}));
  auto head_view = [&](const Tensor& x, int64_t part) {
    return transpose(reshape(narrow(x, 2, part * C, C), {B, T, H, d}), 1, 2);
  };
  Tensor qkv2 = requires_grad_(detach(qkv).clone());
  AttentionOptions causal;
  causal.causal = true;
  Tensor split =
      reshape(transpose(scaled_dot_product_attention(head_view(qkv2, 0), head_view(qkv2, 1),
                                                     head_view(qkv2, 2), causal),
                        1, 2),
              {B, T, C});
  EXPECT_TRUE(test::all_close(packed, split, 1e-14, 1e-14));
  Tensor w = test::random_normal({B, T, C}, DType::f64);
  backward(sum(mul(packed, w)));
  backward(sum(mul(split, w)));
  EXPECT_TRUE(test::all_close(grad(qkv), grad(qkv2), 1e-13, 1e-13));
}

TEST(AttentionGradcheck, the_result_is_physically_b_t_h_d) {
  Tensor q = leaf({2, 3, 4, 5});
  Tensor out = scaled_dot_product_attention(q, q, q);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4, 5}));
  EXPECT_TRUE(detach(out).transpose(1, 2).is_contiguous());
}

TEST(AttentionGradcheck, dropout_reserves_exactly_its_counters) {
  Generator gen(3);
  AttentionOptions o;
  o.dropout_p = 0.1;
  o.generator = &gen;
  Tensor q = test::random_normal({2, 3, 4, 5}, DType::f64);
  Tensor k = test::random_normal({2, 3, 6, 5}, DType::f64);
  scaled_dot_product_attention(q, k, k, o);
  EXPECT_EQ(gen.offset(), philox::blocks_for(2 * 3 * 4 * 6));
  // A rejected input reserves nothing; no dropout reserves nothing.
  EXPECT_ERROR(scaled_dot_product_attention(q, q.select(0, 0), k, o),
               "scaled_dot_product_attention", "k must be 4-D");
  EXPECT_EQ(gen.offset(), philox::blocks_for(2 * 3 * 4 * 6));
  o.dropout_p = 0.0;
  scaled_dot_product_attention(q, k, k, o);
  EXPECT_EQ(gen.offset(), philox::blocks_for(2 * 3 * 4 * 6));
  // packed: B * H * T * T.
  o.dropout_p = 0.5;
  packed_causal_attention(test::random_normal({2, 7, 3 * 4 * 2}, DType::f64), 4, o);
  EXPECT_EQ(gen.offset(), philox::blocks_for(2 * 3 * 4 * 6) + philox::blocks_for(2 * 4 * 7 * 7));
}

// Two forwards at the same generator state drop the same elements; successive
// forwards draw fresh masks.
TEST(AttentionGradcheck, dropout_masks_follow_the_generator) {
  Tensor q = test::random_normal({1, 2, 6, 4}, DType::f64);
  auto run = [&](Generator& gen) {
    AttentionOptions o;
    o.dropout_p = 0.4;
    o.generator = &gen;
    return scaled_dot_product_attention(q, q, q, o);
  };
  Generator a(11), b(11);
  Tensor first = run(a);
  EXPECT_TRUE(test::all_close(first, run(b), 0, 0));
  EXPECT_GT(test::relative_error(run(a), first), 1e-3);
}

// ---- research-model variants (SdpaOptions) --------------------------------------

Fn sdpa_with(const std::function<SdpaOptions()>& make) {
  return [=](const std::vector<Tensor>& x) {
    SdpaOptions o = make();
    if (x.size() > 3) o.bias(x[3]);
    return scaled_dot_product_attention(x[0], x[1], x[2], o);
  };
}

TEST(AttentionGradcheck, grouped_and_multi_query_heads) {
  Fn f = sdpa_with([] { return SdpaOptions().causal(); });
  EXPECT_GRADCHECK(f, leaf({2, 4, 3, 3}), leaf({2, 2, 3, 3}), leaf({2, 2, 3, 2}));
  EXPECT_GRADCHECK(f, leaf({1, 3, 4, 2}), leaf({1, 1, 4, 2}), leaf({1, 1, 4, 3}));
}

TEST(AttentionGradcheck, causal_top_left_and_bottom_right_with_tq_above_tk) {
  for (MaskAlignment a : {MaskAlignment::top_left, MaskAlignment::bottom_right}) {
    SCOPED_TRACE(kernels::alignment_name(a));
    Fn f = sdpa_with([a] { return SdpaOptions().causal(a); });
    EXPECT_GRADCHECK(f, leaf({1, 2, 5, 3}), leaf({1, 2, 3, 3}), leaf({1, 2, 3, 2}));
    EXPECT_GRADCHECK(f, leaf({1, 2, 3, 3}), leaf({1, 1, 5, 3}), leaf({1, 1, 5, 2}));
  }
}

TEST(AttentionGradcheck, padded_batches) {
  const Tensor lq = from_vector<int64_t>({4, 2, 3}, {3}), lk = from_vector<int64_t>({5, 3, 1}, {3});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal bottom-right" : "full");
    Fn f = sdpa_with([=] {
      SdpaOptions o;
      if (causal) o.causal(MaskAlignment::bottom_right);
      return o.seq_lens(lq, lk);
    });
    EXPECT_GRADCHECK(f, leaf({3, 2, 4, 3}), leaf({3, 1, 5, 3}), leaf({3, 1, 5, 2}));
  }
}

TEST(AttentionGradcheck, packed_documents) {
  const Tensor cu = from_vector<int64_t>({0, 2, 2, 5, 6}, {5});
  Fn f = sdpa_with([=] { return SdpaOptions().causal().varlen(cu); });
  EXPECT_GRADCHECK(f, leaf({1, 2, 6, 3}), leaf({1, 2, 6, 3}), leaf({1, 2, 6, 2}));
  // Cross-attention documents: queries and keys packed with their own offsets.
  const Tensor cq = from_vector<int64_t>({0, 1, 4}, {3}), ck = from_vector<int64_t>({0, 3, 5}, {3});
  Fn g = sdpa_with([=] { return SdpaOptions().varlen(cq, ck); });
  EXPECT_GRADCHECK(g, leaf({1, 2, 4, 3}), leaf({1, 1, 5, 3}), leaf({1, 1, 5, 2}));
}

TEST(AttentionGradcheck, sliding_window) {
  Fn f = sdpa_with([] { return SdpaOptions().causal().window(2); });
  EXPECT_GRADCHECK(f, leaf({2, 2, 5, 3}), leaf({2, 1, 5, 3}), leaf({2, 1, 5, 2}));
  Fn g = sdpa_with([] { return SdpaOptions().window(3); });  // left bound only
  EXPECT_GRADCHECK(g, leaf({1, 2, 5, 3}), leaf({1, 2, 5, 3}), leaf({1, 2, 5, 2}));
}

TEST(AttentionGradcheck, differentiable_bias_full_and_broadcast) {
  Fn f = sdpa_with([] { return SdpaOptions(); });
  EXPECT_GRADCHECK(f, leaf({2, 2, 3, 3}), leaf({2, 1, 4, 3}), leaf({2, 1, 4, 2}),
                   leaf({2, 2, 3, 4}));
  Fn c = sdpa_with([] { return SdpaOptions().causal(); });
  EXPECT_GRADCHECK(c, leaf({2, 2, 4, 3}), leaf({2, 2, 4, 3}), leaf({2, 2, 4, 2}),
                   leaf({1, 2, 4, 4}));
  EXPECT_GRADCHECK(c, leaf({2, 2, 4, 3}), leaf({2, 2, 4, 3}), leaf({2, 2, 4, 2}),
                   leaf({2, 1, 4, 4}));
}

TEST(AttentionGradcheck, boolean_mask_with_a_fully_masked_row) {
  std::vector<double> keep(2 * 4 * 5, 1.0);
  for (size_t e = 0; e < keep.size(); ++e)
    if (e % 3 == 1 || e / 5 == 2) keep[e] = 0.0;  // row 2 of batch 0 sees nothing
  const Tensor mask = from_vector(keep, {2, 1, 4, 5}, DType::boolean);
  Fn f = sdpa_with([=] { return SdpaOptions().mask(mask); });
  EXPECT_GRADCHECK(f, leaf({2, 2, 4, 3}), leaf({2, 2, 5, 3}), leaf({2, 2, 5, 2}));
}

TEST(AttentionGradcheck, bias_gets_no_gradient_when_it_does_not_require_one) {
  Tensor q = leaf({1, 2, 3, 4}), bias = test::random_normal({1, 2, 3, 3}, DType::f64);
  Tensor out = scaled_dot_product_attention(q, q, q, SdpaOptions().bias(bias));
  backward(sum(out));
  EXPECT_TRUE(grad(q).defined());
  EXPECT_FALSE(bias.requires_grad());
}

TEST(AttentionGradcheck, sdpa_options_dropout_reserves_its_counters) {
  Generator gen(5);
  Tensor q = test::random_normal({1, 4, 3, 2}, DType::f64);
  Tensor k = test::random_normal({1, 2, 5, 2}, DType::f64);
  scaled_dot_product_attention(q, k, k, SdpaOptions().causal().dropout(0.2, &gen));
  EXPECT_EQ(gen.offset(), philox::blocks_for(1 * 4 * 3 * 5));
  EXPECT_ERROR(scaled_dot_product_attention(q, test::random_normal({1, 3, 5, 2}, DType::f64),
                                            test::random_normal({1, 3, 5, 2}, DType::f64),
                                            SdpaOptions().dropout(0.2, &gen)),
               "scaled_dot_product_attention", "q has 4 heads and k and v have 3");
  EXPECT_EQ(gen.offset(), philox::blocks_for(1 * 4 * 3 * 5));
}

// In a Window (optim/window.h): a grouped-query attention layer with a learned
// bias over right-padded variable-length sequences, trained with K = 4
// micro-batches, takes exactly the updates of the one large batch (Note
// [Accumulation verifier]): the padded rows give 0 and no gradient, so the
// loss sums only real tokens and the count is the number of them.
class AttentionRun : public optim::VerifyRun {
 public:
  static constexpr int64_t kItems = 8, T = 6, D = 5, Hq = 4, Hkv = 2, dh = 3;

  explicit AttentionRun(int64_t K)
      : params_(make_params()),
        opt_(optim::AdamWOptions(0.05)),
        store_(params_, optim::ParamStoreOptions().master_dtype(DType::f64)),
        window_(store_, opt_, optim::WindowOptions().micro_steps(K).max_grad_norm(1.0)) {}

  void micro_step(int64_t w, int64_t begin, int64_t end) override {
    Generator gen(500 + static_cast<uint64_t>(w));
    const Tensor x =
        randn({kItems, T, D}, DType::f64, Device::cpu(), &gen).narrow(0, begin, end - begin);
    const int64_t n = end - begin;
    std::vector<int64_t> lens;
    int64_t tokens = 0;
    for (int64_t i = begin; i < end; ++i) {
      lens.push_back(1 + (7 * i + 3 * w) % T);
      tokens += lens.back();
    }
    auto heads = [&](const Tensor& weight, int64_t h) {
      return transpose(reshape(matmul(x, weight), {n, T, h, dh}), 1, 2);
    };
    const Tensor out = scaled_dot_product_attention(
        heads(params_[0], Hq), heads(params_[1], Hkv), heads(params_[2], Hkv),
        SdpaOptions().causal().seq_lens(from_vector(lens, {n})).bias(params_[3]));
    window_.backward({sum(mul(out, out)), full({}, static_cast<double>(tokens), DType::i64)});
  }
  void close() override { window_.close(); }
  std::vector<double> parameters() const override {
    std::vector<double> flat;
    for (const Tensor& p : params_)
      for (double v : p.to_vector<double>())
        flat.push_back(v);
    return flat;
  }

 private:
  static std::vector<Tensor> make_params() {
    Generator gen(7);
    std::vector<Tensor> p;
    for (const Shape& s :
         {Shape{D, Hq * dh}, Shape{D, Hkv * dh}, Shape{D, Hkv * dh}, Shape{1, Hq, T, T}})
      p.push_back(requires_grad_(randn(s, DType::f64, Device::cpu(), &gen)));
    return p;
  }
  std::vector<Tensor> params_;
  optim::Optimizer opt_;
  optim::ParamStore store_;
  optim::Window window_;
};

TEST(AttentionInWindow, padded_gqa_micro_batches_equal_the_large_batch) {
  optim::VerifyOptions o;
  o.windows = 3;
  o.micro_steps = 4;
  o.batch = AttentionRun::kItems;
  o.tolerance = 1e-10;
  const optim::VerifyReport report =
      optim::verify_accumulation([](int64_t K) { return std::make_unique<AttentionRun>(K); }, o);
  EXPECT_TRUE(report.passed) << report.table();
  ASSERT_EQ(report.parameter_error.size(), 3u);
  std::printf("%s\n", report.table().c_str());
}

TEST(AttentionGradcheck, bad_packed_inputs) {
  const char* op = "packed_causal_attention";
  EXPECT_ERROR(packed_causal_attention(Tensor(), 2), op, "undefined");
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 4, 3, 4}), 2), op, "3-D",
               "[2, 4, 3, 4]");
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 4, 12}), 0), op, "n_head = 0");
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 4, 14}), 2), op, "width 14",
               "3 * n_head = 6");
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 4, 12}).to(DType::i64), 2), op,
               "i64");
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 12, 4}).transpose(1, 2), 2), op,
               "stride 1 in its last dim");
  AttentionOptions bad;
  bad.dropout_p = 1.5;
  EXPECT_ERROR(packed_causal_attention(test::random_normal({2, 4, 12}), 2, bad), "dropout_p = 1.5");
}

}  // namespace
}  // namespace accrue
