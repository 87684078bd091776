// The CPU reference of scaled dot-product attention (kernels/attention.h)
// against softmax(scale q k^T + mask) v written out plainly here in f64, with
// dropout masks taken from accrue::rand at the same generator state; and the
// validation of every bad input.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
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

// The plain options these tests were written for: causal aligned to the
// bottom right (the naive formula's rule).
AttentionOptions options(bool causal, std::optional<double> scale = std::nullopt) {
  AttentionOptions o;
  if (causal) o.causal(kernels::MaskAlignment::bottom_right);
  if (scale) o.scale(*scale);
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
    o.dropout(p, seed, offset);
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
  EXPECT_ERROR(kernels::attention(q, test::random_normal({2, 2, 6, 8}),
                                  test::random_normal({2, 2, 6, 5}), o),
               op, "q has 3 heads and k and v have 2", "[2, 3, 4, 8]", "[2, 2, 6, 8]",
               "multiple of the kv heads");
  EXPECT_ERROR(kernels::attention(q, test::random_normal({1, 3, 6, 8}), v, o), op,
               "differ in the batch B", "[1, 3, 6, 8]");
  EXPECT_ERROR(kernels::attention(q, k, test::random_normal({2, 1, 6, 5}), o), op,
               "differ in the kv heads Hkv", "[2, 1, 6, 5]");
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
    bad.dropout(p);
    EXPECT_ERROR(kernels::attention(q, k, v, bad), op, "dropout_p", "[0, 1)");
  }
  AttentionOptions nan_scale;
  nan_scale.scale(std::numeric_limits<double>::infinity());
  EXPECT_ERROR(kernels::attention(q, k, v, nan_scale), op, "scale", "not finite");

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

// ---- research-model attention: grouped heads, alignments, lengths, documents,
// windows, bias and masks (Note [Attention masks]) -------------------------------

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Which keys (b, h, i) sees, written out per test as PyTorch would build its
// attn_mask; bias(b, h, i, j) is added to the scaled score (0 when absent).
using Visible = std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)>;
using BiasFn = std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)>;

// softmax(scale q k^T + bias, masked) v with query head h reading kv head
// h / (Hq / Hkv); a row that sees nothing gives 0 and lse -inf.
Naive masked_naive(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, double scale,
                   const Visible& visible, const BiasFn& bias = nullptr) {
  const Host4 q(q_t), k(k_t), v(v_t);
  const int64_t B = q.s[0], H = q.s[1], Tq = q.s[2], d = q.s[3], Hkv = k.s[1], Tk = k.s[2],
                dv = v.s[3], g = H / Hkv;
  std::vector<double> out(B * H * Tq * dv, 0.0), lse(B * H * Tq, kNegInf);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk, kNegInf);
        double m = kNegInf;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!visible(b, h, i, j)) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += q.at(b, h, i, c) * k.at(b, h / g, j, c);
          s[j] = scale * dot + (bias ? bias(b, h, i, j) : 0.0);
          m = std::max(m, s[j]);
        }
        if (m == kNegInf) continue;
        double sum = 0.0;
        for (double x : s)
          sum += x == kNegInf ? 0.0 : std::exp(x - m);
        const int64_t row = (b * H + h) * Tq + i;
        lse[row] = m + std::log(sum);
        for (int64_t j = 0; j < Tk; ++j) {
          if (s[j] == kNegInf) continue;
          const double prob = std::exp(s[j] - lse[row]);
          for (int64_t c = 0; c < dv; ++c)
            out[row * dv + c] += prob * v.at(b, h / g, j, c);
        }
      }
  return {from_vector(out, {B, H, Tq, dv}, DType::f64), from_vector(lse, {B, H, Tq}, DType::f64)};
}

// lse equal to the naive one, -inf exactly where the naive one is.
::testing::AssertionResult lse_close(const Tensor& lse, const Tensor& expected) {
  const std::vector<double> a = lse.to_vector<double>(), e = expected.to_vector<double>();
  std::vector<double> a_fin(a), e_fin(e);
  for (size_t i = 0; i < a.size(); ++i) {
    if ((a[i] == kNegInf) != (e[i] == kNegInf))
      return ::testing::AssertionFailure()
             << "lse[" << i << "] = " << a[i] << ", expected " << e[i];
    if (e[i] == kNegInf) a_fin[i] = e_fin[i] = 0.0;
  }
  return all_close(from_vector(a_fin, lse.shape(), DType::f64),
                   from_vector(e_fin, expected.shape(), DType::f64), 1e-12, 1e-12);
}

struct Grads {
  Tensor dq, dk, dv, dbias;
};

Grads backward_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                  const Tensor& grad_out, bool want_dbias = false) {
  kernels::AttentionResult r = kernels::attention(q, k, v, o);
  Grads g{empty(q.shape(), q.dtype()), empty(k.shape(), k.dtype()), empty(v.shape(), v.dtype()),
          want_dbias ? empty(o.get_bias().shape(), q.dtype()) : Tensor()};
  kernels::attention_backward_into(grad_out, q, k, v, r.out, r.lse, o, g.dq, g.dk, g.dv, g.dbias);
  return g;
}

// [B, Hkv, T, d] -> [B, Hkv * g, T, d], each kv head copied for its group.
Tensor repeat_heads(const Tensor& t, int64_t g) {
  const int64_t B = t.size(0), Hkv = t.size(1), T = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({B, Hkv, g, T, d}).contiguous().reshape({B, Hkv * g, T, d});
}

// [B, Hkv * g, T, d] -> [B, Hkv, T, d], each group's heads summed.
Tensor sum_groups(const Tensor& t, int64_t g) {
  const Host4 h(t);
  const int64_t B = h.s[0], H = h.s[1], T = h.s[2], d = h.s[3];
  std::vector<double> out(B * (H / g) * T * d, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < d; ++c)
          out[((b * (H / g) + hh / g) * T + i) * d + c] += h.at(b, hh, i, c);
  return from_vector(out, {B, H / g, T, d}, DType::f64);
}

TEST(CpuAttention, grouped_query_heads_equal_repeated_kv_heads) {
  for (int64_t Hkv : {1, 2, 3}) {  // multi-query, grouped (g = 3), plain (g = 1)
    SCOPED_TRACE(testing::Message() << "Hq=6 Hkv=" << Hkv);
    const int64_t g = 6 / Hkv;
    Tensor q = test::random_normal({2, 6, 5, 4}, DType::f64);
    Tensor k = test::random_normal({2, Hkv, 7, 4}, DType::f64);
    Tensor v = test::random_normal({2, Hkv, 7, 3}, DType::f64);
    AttentionOptions o;
    o.causal(kernels::MaskAlignment::bottom_right);
    kernels::AttentionResult r = kernels::attention(q, k, v, o);
    kernels::AttentionResult e = kernels::attention(q, repeat_heads(k, g), repeat_heads(v, g), o);
    EXPECT_TRUE(all_close(r.out, e.out, 1e-14, 1e-14));
    EXPECT_TRUE(all_close(r.lse, e.lse, 1e-14, 1e-14));
    Naive n = masked_naive(q, k, v, 0.5,
                           [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + 2; });
    EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
    // Backward: dk and dv of a kv head are the sums over its group's query heads.
    Tensor go = test::random_normal({2, 6, 5, 3}, DType::f64);
    Grads a = backward_of(q, k, v, o, go);
    Grads b = backward_of(q, repeat_heads(k, g), repeat_heads(v, g), o, go);
    EXPECT_TRUE(all_close(a.dq, b.dq, 1e-13, 1e-13));
    EXPECT_TRUE(all_close(a.dk, sum_groups(b.dk, g), 1e-13, 1e-13));
    EXPECT_TRUE(all_close(a.dv, sum_groups(b.dv, g), 1e-13, 1e-13));
  }
}

TEST(CpuAttention, causal_alignments_top_left_and_bottom_right) {
  // torch.tril(ones(Tq, Tk)) is top-left; tril(..., diagonal=Tk - Tq) bottom-right.
  for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{4, 7}, {7, 4}, {5, 5}}) {
    for (auto a : {kernels::MaskAlignment::top_left, kernels::MaskAlignment::bottom_right}) {
      SCOPED_TRACE(testing::Message()
                   << "Tq=" << Tq << " Tk=" << Tk << " " << kernels::alignment_name(a));
      Tensor q = test::random_normal({2, 2, Tq, 4}, DType::f64);
      Tensor k = test::random_normal({2, 2, Tk, 4}, DType::f64);
      Tensor v = test::random_normal({2, 2, Tk, 3}, DType::f64);
      kernels::AttentionResult r = kernels::attention(q, k, v, AttentionOptions().causal(a));
      const int64_t shift = a == kernels::MaskAlignment::top_left ? 0 : Tk - Tq;
      Naive n = masked_naive(
          q, k, v, 0.5, [&](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + shift; });
      EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
      EXPECT_TRUE(lse_close(r.lse, n.lse));
    }
  }
  // The default alignment is PyTorch's is_causal.
  EXPECT_EQ(AttentionOptions().causal().get_alignment(), kernels::MaskAlignment::top_left);
}

TEST(CpuAttention, empty_rows_give_zero_output_lse_minus_inf_and_no_gradient) {
  // Bottom-right with Tq > Tk: the first Tq - Tk queries see no key.
  Tensor q = test::random_normal({1, 2, 6, 4}, DType::f64);
  Tensor k = test::random_normal({1, 2, 3, 4}, DType::f64);
  Tensor v = test::random_normal({1, 2, 3, 4}, DType::f64);
  AttentionOptions o;
  o.causal(kernels::MaskAlignment::bottom_right);
  kernels::AttentionResult r = kernels::attention(q, k, v, o);
  Grads g = backward_of(q, k, v, o, test::random_normal({1, 2, 6, 4}, DType::f64));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.lse.select(0, 0).select(0, h).select(0, i).item(), kNegInf);
      EXPECT_TRUE(
          all_close(r.out.select(0, 0).select(0, h).select(0, i), zeros({4}, DType::f64), 0, 0));
      EXPECT_TRUE(
          all_close(g.dq.select(0, 0).select(0, h).select(0, i), zeros({4}, DType::f64), 0, 0));
    }
}

TEST(CpuAttention, padded_batches_equal_each_sequence_alone) {
  const int64_t B = 3, H = 4, Hkv = 2, T = 6, d = 4;
  const std::vector<int64_t> lens = {6, 3, 1};
  Tensor q = test::random_normal({B, H, T, d}, DType::f64);
  Tensor k = test::random_normal({B, Hkv, T, d}, DType::f64);
  Tensor v = test::random_normal({B, Hkv, T, d}, DType::f64);
  Tensor go = test::random_normal({B, H, T, d}, DType::f64);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionOptions o;
    if (causal) o.causal();
    o.seq_lens(from_vector(lens, {B}));
    kernels::AttentionResult r = kernels::attention(q, k, v, o);
    Grads g = backward_of(q, k, v, o, go);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = lens[b];
      SCOPED_TRACE(testing::Message() << "b=" << b << " L=" << L);
      auto one = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(2, 0, L).contiguous(); };
      AttentionOptions alone;
      if (causal) alone.causal();
      kernels::AttentionResult e = kernels::attention(one(q), one(k), one(v), alone);
      EXPECT_TRUE(all_close(one(r.out), e.out, 1e-13, 1e-13));
      EXPECT_TRUE(all_close(one(r.lse.unsqueeze(3)), e.lse.unsqueeze(3), 1e-13, 1e-13));
      Grads ge = backward_of(one(q), one(k), one(v), alone, one(go));
      EXPECT_TRUE(all_close(one(g.dq), ge.dq, 1e-13, 1e-13));
      EXPECT_TRUE(all_close(one(g.dk), ge.dk, 1e-13, 1e-13));
      EXPECT_TRUE(all_close(one(g.dv), ge.dv, 1e-13, 1e-13));
      if (L == T) continue;
      // Padding: output and every gradient 0, lse -inf.
      auto pad = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(2, L, T - L); };
      EXPECT_TRUE(all_close(pad(r.out), zeros({1, H, T - L, d}, DType::f64), 0, 0));
      EXPECT_TRUE(all_close(pad(g.dq), zeros({1, H, T - L, d}, DType::f64), 0, 0));
      EXPECT_TRUE(all_close(pad(g.dk), zeros({1, Hkv, T - L, d}, DType::f64), 0, 0));
      EXPECT_TRUE(all_close(pad(g.dv), zeros({1, Hkv, T - L, d}, DType::f64), 0, 0));
      for (double x : pad(r.lse.unsqueeze(3)).contiguous().to_vector<double>())
        EXPECT_EQ(x, kNegInf);
    }
  }
}

TEST(CpuAttention, kv_lengths_with_bottom_right_causal_are_a_kv_cache) {
  // Decoding 2 new tokens per sequence against caches of 5 and 3 keys (right-padded to 6).
  const int64_t B = 2, T = 2, S = 6;
  Tensor q = test::random_normal({B, 2, T, 4}, DType::f64);
  Tensor k = test::random_normal({B, 1, S, 4}, DType::f64);
  Tensor v = test::random_normal({B, 1, S, 4}, DType::f64);
  const std::vector<int64_t> lq = {2, 2}, lk = {5, 3};
  AttentionOptions o;
  o.causal(kernels::MaskAlignment::bottom_right)
      .seq_lens(from_vector(lq, {B}), from_vector(lk, {B}));
  kernels::AttentionResult r = kernels::attention(q, k, v, o);
  Naive n = masked_naive(q, k, v, 0.5, [&](int64_t b, int64_t, int64_t i, int64_t j) {
    return j < lk[b] && j <= i + lk[b] - lq[b];
  });
  EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
  EXPECT_TRUE(lse_close(r.lse, n.lse));
}

TEST(CpuAttention, packed_documents_equal_each_document_alone) {
  // Three documents of 3, 0 and 4 tokens packed into T = 7 (an empty one between).
  const std::vector<int64_t> cu = {0, 3, 3, 7};
  const int64_t T = 7, H = 4, Hkv = 2, d = 4;
  Tensor q = test::random_normal({1, H, T, d}, DType::f64);
  Tensor k = test::random_normal({1, Hkv, T, d}, DType::f64);
  Tensor v = test::random_normal({1, Hkv, T, d}, DType::f64);
  Tensor go = test::random_normal({1, H, T, d}, DType::f64);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionOptions o;
    if (causal) o.causal();
    o.varlen(from_vector(cu, {4}));
    kernels::AttentionResult r = kernels::attention(q, k, v, o);
    Grads g = backward_of(q, k, v, o, go);
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const int64_t start = cu[n], L = cu[n + 1] - cu[n];
      if (L == 0) continue;
      SCOPED_TRACE(testing::Message() << "document " << n);
      auto doc = [&](const Tensor& t) { return t.narrow(2, start, L).contiguous(); };
      AttentionOptions alone;
      if (causal) alone.causal();
      kernels::AttentionResult e = kernels::attention(doc(q), doc(k), doc(v), alone);
      EXPECT_TRUE(all_close(doc(r.out), e.out, 1e-13, 1e-13));
      Grads ge = backward_of(doc(q), doc(k), doc(v), alone, doc(go));
      EXPECT_TRUE(all_close(doc(g.dq), ge.dq, 1e-13, 1e-13));
      EXPECT_TRUE(all_close(doc(g.dk), ge.dk, 1e-13, 1e-13));
      EXPECT_TRUE(all_close(doc(g.dv), ge.dv, 1e-13, 1e-13));
    }
  }
}

TEST(CpuAttention, sliding_window_sees_the_last_w_keys) {
  for (int64_t w : {1, 2, 3, 10}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(testing::Message() << "window " << w << (causal ? " causal" : ""));
      Tensor q = test::random_normal({2, 2, 6, 4}, DType::f64);
      Tensor k = test::random_normal({2, 1, 8, 4}, DType::f64);
      Tensor v = test::random_normal({2, 1, 8, 4}, DType::f64);
      AttentionOptions o;
      if (causal) o.causal(kernels::MaskAlignment::bottom_right);
      o.alignment(kernels::MaskAlignment::bottom_right).window(w);
      kernels::AttentionResult r = kernels::attention(q, k, v, o);
      // Hugging Face's sliding window: key j visible iff diag - w < j (<= diag when causal).
      Naive n = masked_naive(q, k, v, 0.5, [&](int64_t, int64_t, int64_t i, int64_t j) {
        const int64_t diag = i + 2;
        return j > diag - w && (!causal || j <= diag);
      });
      EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
      EXPECT_TRUE(lse_close(r.lse, n.lse));
    }
  }
}

TEST(CpuAttention, additive_bias_broadcasts_and_a_bool_mask_equals_minus_inf) {
  const int64_t B = 2, H = 4, Tq = 5, Tk = 6;
  Tensor q = test::random_normal({B, H, Tq, 4}, DType::f64);
  Tensor k = test::random_normal({B, 2, Tk, 4}, DType::f64);
  Tensor v = test::random_normal({B, 2, Tk, 3}, DType::f64);
  for (Shape bs :
       {Shape{B, H, Tq, Tk}, Shape{1, H, Tq, Tk}, Shape{B, 1, Tq, Tk}, Shape{1, 1, Tq, Tk}}) {
    SCOPED_TRACE(shape_str(bs));
    Tensor bias = test::random_normal(bs, DType::f64);
    const Host4 hb(bias);
    kernels::AttentionResult r = kernels::attention(q, k, v, AttentionOptions().bias(bias));
    Naive n = masked_naive(
        q, k, v, 0.5, [](int64_t, int64_t, int64_t, int64_t) { return true; },
        [&](int64_t b, int64_t h, int64_t i, int64_t j) {
          return hb.at(bs[0] == 1 ? 0 : b, bs[1] == 1 ? 0 : h, i, j);
        });
    EXPECT_TRUE(all_close(r.out, n.out, 1e-12, 1e-12));
    EXPECT_TRUE(lse_close(r.lse, n.lse));
  }
  // A boolean mask with a fully masked row; the same as a bias of 0 / -inf.
  std::vector<double> keep(B * Tq * Tk);
  std::vector<double> additive(B * Tq * Tk);
  for (size_t e = 0; e < keep.size(); ++e) {
    keep[e] = (e * 7 % 5 != 0) && (e / Tk != 3) ? 1.0 : 0.0;  // row 3 of batch 0 sees nothing
    additive[e] = keep[e] != 0.0 ? 0.0 : kNegInf;
  }
  Tensor mask = from_vector(keep, {B, 1, Tq, Tk}, DType::boolean);
  Tensor as_bias = from_vector(additive, {B, 1, Tq, Tk}, DType::f64);
  kernels::AttentionResult rm = kernels::attention(q, k, v, AttentionOptions().mask(mask));
  kernels::AttentionResult rb = kernels::attention(q, k, v, AttentionOptions().bias(as_bias));
  Naive n = masked_naive(q, k, v, 0.5, [&](int64_t b, int64_t, int64_t i, int64_t j) {
    return keep[(b * Tq + i) * Tk + j] != 0.0;
  });
  EXPECT_TRUE(all_close(rm.out, n.out, 1e-12, 1e-12));
  EXPECT_TRUE(lse_close(rm.lse, n.lse));
  EXPECT_TRUE(all_close(rb.out, n.out, 1e-12, 1e-12));
  EXPECT_TRUE(lse_close(rb.lse, n.lse));
}

TEST(CpuAttention, bias_gradient_sums_over_its_broadcast_dims) {
  const int64_t B = 2, H = 3, Tq = 4, Tk = 5;
  Tensor q = test::random_normal({B, H, Tq, 4}, DType::f64);
  Tensor k = test::random_normal({B, H, Tk, 4}, DType::f64);
  Tensor v = test::random_normal({B, H, Tk, 4}, DType::f64);
  Tensor go = test::random_normal({B, H, Tq, 4}, DType::f64);
  Tensor shared = test::random_normal({1, H, Tq, Tk}, DType::f64);
  AttentionOptions o;
  o.causal().bias(shared);
  Grads g = backward_of(q, k, v, o, go, true);
  // The same bias given per batch entry: its gradient's sum over the batch.
  AttentionOptions full_o;
  full_o.causal().bias(shared.expand({B, H, Tq, Tk}).contiguous());
  Grads gf = backward_of(q, k, v, full_o, go, true);
  EXPECT_TRUE(all_close(g.dq, gf.dq, 1e-14, 1e-14));
  std::vector<double> summed = gf.dbias.narrow(0, 0, 1).contiguous().to_vector<double>();
  const std::vector<double> second = gf.dbias.narrow(0, 1, 1).contiguous().to_vector<double>();
  for (size_t e = 0; e < summed.size(); ++e)
    summed[e] += second[e];
  EXPECT_TRUE(all_close(g.dbias, from_vector(summed, {1, H, Tq, Tk}, DType::f64), 1e-13, 1e-13));
  // dbias is dS: zero where masked, and each row sums to 0 (softmax's gradient).
  const Host4 db(gf.dbias);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        double row = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          if (j > i) {
            EXPECT_EQ(db.at(b, h, i, j), 0.0);
          }
          row += db.at(b, h, i, j);
        }
        EXPECT_NEAR(row, 0.0, 1e-12);
      }
}

TEST(CpuAttention, lengths_and_offsets_may_live_on_the_cpu_for_any_dtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = test::random_normal({2, 4, 6, 8}, dt);
    Tensor k = test::random_normal({2, 2, 6, 8}, dt);
    AttentionOptions o;
    o.causal().window(3).seq_lens(from_vector<int64_t>({4, 6}, {2}));
    kernels::AttentionResult r = kernels::attention(q, k, k, o);
    Naive n = masked_naive(as_f64(q), as_f64(k), as_f64(k), 1.0 / std::sqrt(8.0),
                           [](int64_t b, int64_t, int64_t i, int64_t j) {
                             const int64_t L = b == 0 ? 4 : 6;
                             return i < L && j < L && j <= i && j > i - 3;
                           });
    EXPECT_TRUE(all_close(as_f64(r.out), n.out, test::default_rtol(dt), test::default_atol(dt)));
  }
}

TEST(CpuAttention, bad_masks_and_lengths_throw_naming_the_values) {
  const char* op = "scaled_dot_product_attention";
  Tensor q = test::random_normal({2, 4, 5, 8});
  Tensor k = test::random_normal({2, 2, 6, 8});
  auto lens = [](std::vector<int64_t> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return from_vector(v, {n});
  };
  auto call = [&](const AttentionOptions& o) { return kernels::attention(q, k, k, o); };
  EXPECT_ERROR(call(AttentionOptions().window(-1)), op, "window = -1");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(lens({5, 5}))), op, "seq_len_kv must be given",
               "Tq = 5", "Tk = 6");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(lens({5, 4}), lens({6, 7}))), op,
               "seq_len_kv[1] = 7", "[0, 6]");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(lens({-1, 2}), lens({6, 6}))), op,
               "seq_len_q[0] = -1");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(lens({5}), lens({6, 6}))), op, "seq_len_q", "[1]",
               "must be [2]");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(lens({5, 5}).to(DType::i32), lens({6, 6}))), op,
               "seq_len_q has dtype i32", "expected i64");
  EXPECT_ERROR(call(AttentionOptions().seq_lens(Tensor(), lens({6, 6}))), op,
               "seq_len_kv is set without seq_len_q");
  EXPECT_ERROR(call(AttentionOptions().varlen(lens({0, 5}), lens({0, 6}))), op, "packed documents",
               "B = 1", "[2, 4, 5, 8]");
  Tensor q1 = q.narrow(0, 0, 1), k1 = k.narrow(0, 0, 1);
  auto call1 = [&](const AttentionOptions& o) { return kernels::attention(q1, k1, k1, o); };
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({0, 2, 5}), lens({0, 3, 5}))), op,
               "cu_seqlens_kv[2] = 5", "packed length 6");
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({1, 5}), lens({0, 6}))), op,
               "cu_seqlens_q[0] = 1", "must be 0");
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({0, 4, 2, 5}), lens({0, 1, 2, 6}))), op,
               "cu_seqlens_q decreases at 2", "(4 then 2)");
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({0, 5}), lens({0, 2, 6}))), op,
               "cu_seqlens_kv of shape [3]", "must be [2]");
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({5}))), op, "N >= 1");
  EXPECT_ERROR(call1(AttentionOptions().varlen(lens({0, 5})).seq_lens(lens({5}), lens({6}))), op,
               "exclusive");
  EXPECT_ERROR(call(AttentionOptions().bias(test::random_normal({2, 4, 5, 5}))), op,
               "bias of shape [2, 4, 5, 5]", "does not broadcast", "[2, 4, 5, 6]");
  EXPECT_ERROR(call(AttentionOptions().bias(test::random_normal({3, 4, 5, 6}))), op,
               "bias of shape [3, 4, 5, 6]");
  EXPECT_ERROR(call(AttentionOptions().bias(test::random_normal({1, 2, 5, 6}))), op,
               "bias of shape [1, 2, 5, 6]");
  EXPECT_ERROR(call(AttentionOptions().bias(test::random_normal({5, 6}))), op, "bias must be 4-D",
               "[5, 6]");
  EXPECT_ERROR(call(AttentionOptions().bias(test::random_normal({1, 1, 5, 6}, DType::f64))), op,
               "bias has dtype f64", "q has dtype f32", "bias.to(DType::f32)");
  EXPECT_ERROR(call(AttentionOptions().mask(test::random_normal({1, 1, 5, 6}))), op,
               "mask has dtype f32", "expected bool");
  EXPECT_ERROR(call(AttentionOptions()
                        .bias(test::random_normal({1, 1, 5, 6}))
                        .mask(zeros({1, 1, 5, 6}, DType::boolean))),
               op, "not both");
  // dbias needs an additive bias and the bias's shape.
  const char* bop = "scaled_dot_product_attention_backward";
  AttentionOptions o;
  o.bias(test::random_normal({1, 4, 5, 6}));
  kernels::AttentionResult r = kernels::attention(q, k, k, o);
  Tensor dq = empty(q.shape()), dk = empty(k.shape()), dv = empty(k.shape());
  EXPECT_ERROR(kernels::attention_backward_into(r.out, q, k, k, r.out, r.lse, o, dq, dk, dv,
                                                empty({2, 4, 5, 6})),
               bop, "dbias of shape [2, 4, 5, 6]", "[1, 4, 5, 6]");
  EXPECT_ERROR(kernels::attention_backward_into(r.out, q, k, k, r.out, r.lse, AttentionOptions(),
                                                dq, dk, dv, empty({1, 4, 5, 6})),
               bop, "no additive bias");
}

TEST(CpuAttention, set_cudnn_attention_turns_it_off_and_on) {
  const bool before = kernels::cudnn_attention_available();
  kernels::set_cudnn_attention(false);
  EXPECT_FALSE(kernels::cudnn_attention_available());
  kernels::set_cudnn_attention(true);
  EXPECT_EQ(kernels::cudnn_attention_available(), before);
}

TEST(CpuAttention, the_last_path_is_the_cpu_reference) {
  Tensor q = test::random_normal({1, 2, 3, 8});
  kernels::attention(q, q, q, AttentionOptions().causal());
  EXPECT_EQ(kernels::last_attention_path(), kernels::AttentionPath::cpu);
  EXPECT_STREQ(kernels::attention_path_name(kernels::last_attention_path()), "cpu");
  EXPECT_TRUE(kernels::last_attention_refusal().empty());
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
