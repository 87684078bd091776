// The CPU reference of scaled dot-product attention (kernels/attention.h)
// against softmax(scale q k^T + mask) v written out plainly here in f64, with
// dropout masks taken from accrue::rand at the same generator state; and the
// validation of every bad input.
#include <gmock/gmock.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "accrue/core/env_flag.h"
#include "accrue/core/random.h"
#include "accrue/kernels/attention.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::AttentionOptions;
using test::all_close;

// A 4-D tensor's values in row-major order, as f64.
struct Host4 {
  std::vector<double> v;
  Shape s;
  explicit Host4(const Tensor& t) : v(t.to_vector<double>()), s(t.shape()) {}
  double at(int64_t b, int64_t h, int64_t i, int64_t c) const {
    return v[((b * s[1] + h) * s[2] + i) * s[3] + c];
  }
};

struct Naive {
  Tensor out;  // f64 [B, H, Tq, dv]
  Tensor lse;  // f64 [B, H, Tq]
};

// softmax(scale q k^T + mask) (* keep / (1 - p)) v, the whole score matrix at once.
// keep: f64 [B, H, Tq, Tk] of 0/1, or undefined for no dropout.
Naive naive_attention(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, bool causal,
                      double scale, double p = 0.0, const Tensor& keep_t = Tensor()) {
  const Host4 q(q_t), k(k_t), v(v_t);
  const int64_t B = q.s[0], H = q.s[1], Tq = q.s[2], d = q.s[3], Tk = k.s[2], dv = v.s[3];
  std::vector<double> keep;
  if (keep_t.defined()) keep = keep_t.to_vector<double>();
  std::vector<double> out(B * H * Tq * dv), lse(B * H * Tq);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk);
        for (int64_t j = 0; j < Tk; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += q.at(b, h, i, c) * k.at(b, h, j, c);
          const bool masked = causal && j > i + (Tk - Tq);
          s[j] = masked ? -std::numeric_limits<double>::infinity() : scale * dot;
        }
        double m = -std::numeric_limits<double>::infinity();
        for (double x : s)
          m = std::max(m, x);
        double sum = 0.0;
        for (double x : s)
          sum += std::exp(x - m);
        const int64_t row = (b * H + h) * Tq + i;
        lse[row] = m + std::log(sum);
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < Tk; ++j) {
            double prob = std::exp(s[j] - m) / sum;
            if (!keep.empty()) prob *= keep[row * Tk + j] / (1.0 - p);
            acc += prob * v.at(b, h, j, c);
          }
          out[row * dv + c] = acc;
        }
      }
    }
  }
  return {from_vector(out, {B, H, Tq, dv}, DType::f64), from_vector(lse, {B, H, Tq}, DType::f64)};
}

Tensor as_f64(const Tensor& t) {
  return t.to(DType::f64);
}

AttentionOptions options(bool causal, std::optional<double> scale = std::nullopt) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale;
  return o;
}

TEST(CpuAttention, matches_the_naive_formula_in_f64) {
  struct Case {
    int64_t B, H, Tq, Tk, d, dv;
    bool causal;
  };
  for (const Case& c : {Case{2, 3, 5, 5, 4, 4, false}, Case{2, 3, 5, 5, 4, 4, true},
                        Case{1, 2, 3, 7, 4, 6, false}, Case{1, 2, 7, 3, 5, 2, false},
                        Case{2, 1, 4, 9, 3, 5, true}, Case{1, 1, 1, 6, 8, 8, true}}) {
    SCOPED_TRACE(testing::Message()
                 << "B=" << c.B << " H=" << c.H << " Tq=" << c.Tq << " Tk=" << c.Tk << " d=" << c.d
                 << " dv=" << c.dv << (c.causal ? " causal" : ""));
    Tensor q = test::random_normal({c.B, c.H, c.Tq, c.d}, DType::f64);
    Tensor k = test::random_normal({c.B, c.H, c.Tk, c.d}, DType::f64);
    Tensor v = test::random_normal({c.B, c.H, c.Tk, c.dv}, DType::f64);
    kernels::AttentionResult r = kernels::attention(q, k, v, options(c.causal));
    Naive n = naive_attention(q, k, v, c.causal, 1.0 / std::sqrt(static_cast<double>(c.d)));
    EXPECT_EQ(r.out.shape(), (Shape{c.B, c.H, c.Tq, c.dv}));
    EXPECT_EQ(r.lse.dtype(), DType::f64);
    EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(r.lse, n.lse, 1e-12, 1e-12));
  }
}

TEST(CpuAttention, causal_mask_aligns_to_the_bottom_right) {
  // Tq = 2, Tk = 4: query 0 sees keys 0..2, query 1 all four. With v = identity
  // rows and equal scores, out[i] is the uniform distribution over the visible keys.
  Tensor q = zeros({1, 1, 2, 3}, DType::f64);
  Tensor k = test::random_normal({1, 1, 4, 3}, DType::f64);
  std::vector<double> eye(16, 0.0);
  for (int j = 0; j < 4; ++j)
    eye[j * 4 + j] = 1.0;
  Tensor v = from_vector(eye, {1, 1, 4, 4}, DType::f64);
  kernels::AttentionResult r = kernels::attention(q, k, v, options(true));
  const std::vector<double> third = {1 / 3.0, 1 / 3.0, 1 / 3.0, 0.0}, quarter(4, 0.25);
  std::vector<double> expected = third;
  expected.insert(expected.end(), quarter.begin(), quarter.end());
  EXPECT_TRUE(all_close(r.out, from_vector(expected, {1, 1, 2, 4}, DType::f64), 1e-15, 1e-15));
  EXPECT_TRUE(all_close(r.lse, from_vector<double>({std::log(3.0), std::log(4.0)}, {1, 1, 2}),
                        1e-15, 1e-15));
}

TEST(CpuAttention, explicit_scale) {
  Tensor q = test::random_normal({2, 2, 4, 3}, DType::f64);
  Tensor k = test::random_normal({2, 2, 6, 3}, DType::f64);
  Tensor v = test::random_normal({2, 2, 6, 5}, DType::f64);
  kernels::AttentionResult r = kernels::attention(q, k, v, options(false, 0.37));
  Naive n = naive_attention(q, k, v, false, 0.37);
  EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(r.lse, n.lse, 1e-12, 1e-12));
}

TEST(CpuAttention, every_dtype_computes_from_its_rounded_inputs) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << (causal ? " causal" : ""));
      Tensor q = test::random_normal({2, 2, 6, 8}, dt);
      Tensor k = test::random_normal({2, 2, 6, 8}, dt);
      Tensor v = test::random_normal({2, 2, 6, 8}, dt);
      kernels::AttentionResult r = kernels::attention(q, k, v, options(causal));
      EXPECT_EQ(r.out.dtype(), dt);
      EXPECT_EQ(r.lse.dtype(), DType::f32);
      Naive n = naive_attention(as_f64(q), as_f64(k), as_f64(v), causal, 1.0 / std::sqrt(8.0));
      // One rounding of the output to the dtype; lse rounds once to f32.
      EXPECT_TRUE(all_close(as_f64(r.out), n.out, test::default_rtol(dt), test::default_atol(dt)));
      EXPECT_TRUE(all_close(as_f64(r.lse), n.lse, 1e-6, 1e-6));
    }
  }
}

TEST(CpuAttention, output_is_physically_b_t_h_d) {
  Tensor q = test::random_normal({2, 3, 4, 5}, DType::f32);
  kernels::AttentionResult r = kernels::attention(q, q, q, options(true));
  EXPECT_EQ(r.out.shape(), (Shape{2, 3, 4, 5}));
  EXPECT_TRUE(r.out.transpose(1, 2).is_contiguous());
  EXPECT_TRUE(r.lse.is_contiguous());
  EXPECT_EQ(r.lse.shape(), (Shape{2, 3, 4}));
}

// GPT-2's layout: q, k, v are head views of one [B, T, 3, H, d] buffer.
TEST(CpuAttention, packed_qkv_views_and_a_strided_output) {
  const int64_t B = 2, T = 5, H = 3, d = 4;
  Tensor qkv = test::random_normal({B, T, 3, H, d}, DType::f64);
  Tensor q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
         v = qkv.select(2, 2).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  // out written into the middle of a larger buffer.
  Tensor big = full({B, T, H, 2 * d}, 7.0, DType::f64);
  Tensor out = big.narrow(3, d, d).transpose(1, 2);
  Tensor lse = empty({B, H, T}, DType::f64);
  kernels::attention_into(q, k, v, options(true), out, lse);
  Naive n = naive_attention(q.contiguous(), k.contiguous(), v.contiguous(), true, 0.5);
  EXPECT_TRUE(all_close(out, n.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(lse, n.lse, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(big.narrow(3, 0, d), full({B, T, H, d}, 7.0, DType::f64), 0, 0))
      << "attention_into wrote outside its output view";
}

// The mask is the one accrue::rand draws at the generator state (seed, offset):
// element (b, h, i, j) kept iff its f32 uniform is >= p.
TEST(CpuAttention, dropout_mask_is_the_philox_uniform_at_the_reserved_counters) {
  const int64_t B = 2, H = 2, Tq = 5, Tk = 7;
  const double p = 0.3;
  const uint64_t seed = 1234, offset = 77;
  Tensor q = test::random_normal({B, H, Tq, 4}, DType::f64);
  Tensor k = test::random_normal({B, H, Tk, 4}, DType::f64);
  Tensor v = test::random_normal({B, H, Tk, 3}, DType::f64);
  Generator gen(seed);
  gen.set_state(seed, offset);
  Tensor u = rand({B, H, Tq, Tk}, DType::f32, Device::cpu(), &gen);
  std::vector<double> keep = u.to_vector<double>();
  int64_t dropped = 0;
  for (double& x : keep) {
    x = x >= p ? 1.0 : 0.0;
    dropped += x == 0.0;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, static_cast<int64_t>(keep.size()));
  for (bool causal : {false, true}) {
    if (causal && Tq > Tk) continue;
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionOptions o = options(causal);
    o.dropout_p = p;
    o.seed = seed;
    o.offset = offset;
    kernels::AttentionResult r = kernels::attention(q, k, v, o);
    Naive n = naive_attention(q, k, v, causal, 0.5, p, from_vector(keep, {B, H, Tq, Tk}));
    EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
    // lse is the statistic of the undropped softmax.
    EXPECT_TRUE(all_close(r.lse, naive_attention(q, k, v, causal, 0.5).lse, 1e-12, 1e-12));
  }
}

TEST(CpuAttention, backward_of_no_query_zeroes_dk_and_dv) {
  Tensor q = empty({1, 2, 0, 4}, DType::f64), k = test::random_normal({1, 2, 3, 4}, DType::f64);
  Tensor v = test::random_normal({1, 2, 3, 5}, DType::f64);
  kernels::AttentionResult r = kernels::attention(q, k, v, options(false));
  EXPECT_EQ(r.out.numel(), 0);
  Tensor dq = empty(q.shape(), DType::f64), dk = full(k.shape(), 9.0, DType::f64),
         dv = full(v.shape(), 9.0, DType::f64);
  kernels::attention_backward_into(r.out, q, k, v, r.out, r.lse, options(false), dq, dk, dv);
  EXPECT_TRUE(all_close(dk, zeros(k.shape(), DType::f64), 0, 0));
  EXPECT_TRUE(all_close(dv, zeros(v.shape(), DType::f64), 0, 0));
}

TEST(CpuAttention, bad_inputs_throw_naming_the_op_and_values) {
  const char* op = "scaled_dot_product_attention";
  Tensor q = test::random_normal({2, 3, 4, 8});
  Tensor k = test::random_normal({2, 3, 6, 8});
  Tensor v = test::random_normal({2, 3, 6, 5});
  const AttentionOptions o;
  EXPECT_ERROR(kernels::attention(Tensor(), k, v, o), op, "q is an undefined tensor");
  EXPECT_ERROR(kernels::attention(q.select(0, 0), k, v, o), op, "q must be 4-D", "[3, 4, 8]");
  EXPECT_ERROR(kernels::attention(q, test::random_normal({2, 2, 6, 8}), v, o), op, "batch or heads",
               "[2, 3, 4, 8]", "[2, 2, 6, 8]");
  EXPECT_ERROR(kernels::attention(q, test::random_normal({2, 3, 6, 7}), v, o), op, "head dim d",
               "[2, 3, 6, 7]");
  EXPECT_ERROR(kernels::attention(q, k, test::random_normal({2, 3, 5, 5}), o), op, "key count Tk",
               "[2, 3, 5, 5]");
  EXPECT_ERROR(kernels::attention(q, k.to(DType::f64), v, o), op, "dtypes of q (f32) and k (f64)");
  EXPECT_ERROR(kernels::attention(q.to(DType::i64), k.to(DType::i64), v.to(DType::i64), o), op,
               "i64", "floating");
  EXPECT_ERROR(kernels::attention(test::random_normal({2, 3, 8, 4}).transpose(2, 3), k, v, o), op,
               "q of shape [2, 3, 4, 8]", "stride 1 in its last dim");
  EXPECT_ERROR(kernels::attention(q, empty({2, 3, 0, 8}), empty({2, 3, 0, 5}), o), op,
               "at least one key");
  for (double p : {-0.1, 1.0, std::nan("")}) {
    AttentionOptions bad;
    bad.dropout_p = p;
    EXPECT_ERROR(kernels::attention(q, k, v, bad), op, "dropout_p", "[0, 1)");
  }
  AttentionOptions nan_scale;
  nan_scale.scale = std::numeric_limits<double>::infinity();
  EXPECT_ERROR(kernels::attention(q, k, v, nan_scale), op, "scale", "not finite");
  // Causal needs Tq <= Tk: no query row may be fully masked.
  EXPECT_ERROR(kernels::attention(k, q, test::random_normal({2, 3, 4, 5}), options(true)), op,
               "causal", "Tq = 6", "Tk = 4");

  // attention_into's outputs.
  Tensor out = empty({2, 3, 4, 5}), lse = empty({2, 3, 4});
  EXPECT_ERROR(kernels::attention_into(q, k, v, o, empty({2, 3, 4, 8}), lse), op, "out of shape",
               "[2, 3, 4, 8]", "[2, 3, 4, 5]");
  EXPECT_ERROR(kernels::attention_into(q, k, v, o, out.to(DType::f64), lse), op,
               "out has dtype f64");
  EXPECT_ERROR(kernels::attention_into(q, k, v, o, out, lse.to(DType::f64)), op,
               "lse has dtype f64", "expected f32");
  EXPECT_ERROR(kernels::attention_into(q, k, v, o, out, empty({2, 4, 3}).transpose(1, 2)), op,
               "lse of shape [2, 3, 4]", "contiguous");
  EXPECT_ERROR(kernels::attention_into(q, k, v, o, out, empty({2, 3, 5})), op, "lse of shape",
               "[2, 3, 5]");

  // Backward's tensors.
  const char* bop = "scaled_dot_product_attention_backward";
  kernels::AttentionResult r = kernels::attention(q, k, v, o);
  Tensor dq = empty(q.shape()), dk = empty(k.shape()), dv = empty(v.shape());
  EXPECT_ERROR(
      kernels::attention_backward_into(empty({2, 3, 4, 6}), q, k, v, r.out, r.lse, o, dq, dk, dv),
      bop, "grad_out of shape [2, 3, 4, 6]");
  EXPECT_ERROR(kernels::attention_backward_into(r.out, q, k, v, r.out, r.lse, o, dq, dv, dv), bop,
               "dk of shape [2, 3, 6, 5]", "[2, 3, 6, 8]");
  EXPECT_ERROR(kernels::attention_backward_into(r.out, q, k, v, r.out, r.lse, o, Tensor(), dk, dv),
               bop, "dq is an undefined tensor");
}

// Note [Attention paths]: ACCRUE_ATTENTION_COMPOSED=1 turns cuDNN's attention
// off for the whole process (the flag is read once, so this runs in its own
// process: the ctest entry attention_composed_switch sets it).
TEST(AttentionPaths, the_composed_switch_turns_cudnn_attention_off) {
  if (!env_flag("ACCRUE_ATTENTION_COMPOSED"))
    GTEST_SKIP() << "runs under ACCRUE_ATTENTION_COMPOSED=1 (ctest attention_composed_switch)";
  EXPECT_FALSE(kernels::cudnn_attention_available());
}

}  // namespace
}  // namespace accrue
