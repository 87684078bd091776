// Note [Packed documents as padded] on the CPU: packed documents gathered
// into their padded form, run there by the CPU reference and gathered back,
// equal the CPU reference run on the packed documents directly (forward out
// and lse, backward dq, dk and dv) in f64, over grouped heads, empty
// documents, keys no query sees, Tq != Tk with both alignments, windows and
// rows that see no key. This is the conversion cuDNN's packed path runs on
// the GPU; the padded form is also checked field by field.
#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <vector>

#include "accrue/kernels/attention.h"
#include "accrue/kernels/attention_packed.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::AttentionOptions;
using kernels::AttentionParams;
using kernels::MaskAlignment;
using kernels::PackedAsPadded;

struct Case {
  std::string name;
  int64_t H, Hkv, d, dv;
  std::vector<int64_t> cu_q, cu_kv;
  AttentionOptions options;  // without the offsets
  bool rows_without_keys;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"gqa causal, an empty document",
               4,
               2,
               8,
               8,
               {0, 5, 5, 12, 20},
               {0, 5, 5, 12, 20},
               AttentionOptions().causal(),
               false});
  // Document 1 has keys but no query: they get no gradient.
  c.push_back({"Tq != Tk bottom-right causal",
               4,
               2,
               8,
               8,
               {0, 3, 3, 10, 12},
               {0, 7, 9, 20, 26},
               AttentionOptions().causal(MaskAlignment::bottom_right),
               false});
  c.push_back({"Tq != Tk bottom-right causal window, mqa",
               3,
               1,
               8,
               8,
               {0, 3, 3, 10, 12},
               {0, 7, 9, 20, 26},
               AttentionOptions().causal(MaskAlignment::bottom_right).window(2),
               false});
  c.push_back({"top-left window, not causal, dv != d",
               4,
               2,
               8,
               6,
               {0, 6, 14, 15},
               {0, 4, 13, 20},
               AttentionOptions().window(3),
               false});
  // Five documents with queries: the padded batch holds six, the sixth a
  // copy of the cheapest document (2), whose results are dropped.
  c.push_back({"five documents and a copy, long ones",
               2,
               1,
               8,
               8,
               {0, 70, 72, 75, 140, 150},
               {0, 70, 73, 77, 150, 160},
               AttentionOptions().causal(MaskAlignment::bottom_right).window(40),
               false});
  // Document 0's first two rows (bottom-right, 4 queries on 2 keys) and all
  // of document 1 (no key) see nothing.
  c.push_back({"rows without keys",
               2,
               2,
               8,
               8,
               {0, 4, 9},
               {0, 2, 2},
               AttentionOptions().causal(MaskAlignment::bottom_right).scale(0.3),
               true});
  return c;
}

Tensor offsets(const std::vector<int64_t>& cu) {
  return from_vector(cu, {static_cast<int64_t>(cu.size())});
}

// lse elementwise within tol, -inf exactly where expected has it.
::testing::AssertionResult lse_close(const Tensor& actual, const Tensor& expected, double tol) {
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = std::isinf(e[i]) ? a[i] == e[i] : std::abs(a[i] - e[i]) <= tol;
    if (!ok)
      return ::testing::AssertionFailure()
             << "lse[" << i << "] = " << a[i] << ", expected " << e[i];
  }
  return ::testing::AssertionSuccess();
}

// The CPU reference as the padded problem's runner.
bool cpu_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                 const Tensor& out, const Tensor& lse) {
  kernels::cpu::attention_forward(q, k, v, p, out, lse);
  return true;
}

bool cpu_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv) {
  kernels::cpu::attention_backward(g, q, k, v, out, lse, p, dq, dk, dv, Tensor());
  return true;
}

TEST(CpuAttentionPacked, padded_form_equals_the_packed_reference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const int64_t Tq = c.cu_q.back(), Tk = c.cu_kv.back();
    const Tensor q = test::random_normal({1, c.H, Tq, c.d}, DType::f64);
    const Tensor k = test::random_normal({1, c.Hkv, Tk, c.d}, DType::f64);
    const Tensor v = test::random_normal({1, c.Hkv, Tk, c.dv}, DType::f64);
    const Tensor go = test::random_normal({1, c.H, Tq, c.dv}, DType::f64);
    AttentionOptions o = c.options;
    o.varlen(offsets(c.cu_q), offsets(c.cu_kv));

    const PackedAsPadded pp = kernels::packed_as_padded(kernels::attention_params(q, k, v, o));
    ASSERT_EQ(pp.refusal, "");
    EXPECT_EQ(pp.rows_without_keys, c.rows_without_keys);

    // The direct packed reference; out is [1, Tq, H, dv] in memory.
    const kernels::AttentionResult r = kernels::attention(q, k, v, o);
    const Tensor dq = empty(q.shape(), DType::f64), dk = empty(k.shape(), DType::f64),
                 dv = empty(v.shape(), DType::f64);
    kernels::attention_backward_into(go, q, k, v, r.out, r.lse, o, dq, dk, dv);

    // Through the padded form: out contiguous [1, H, Tq, dv] (its rows are
    // a strided view), the gradients [1, T, H, d] in memory (their rows are
    // contiguous): both ways of gathering back. Poisoned, so a row not
    // written shows.
    const Tensor out = empty({1, c.H, Tq, c.dv}, DType::f64), lse = empty({1, c.H, Tq}, DType::f64);
    const auto rows_first = [](const Shape& s) {
      return empty({s[0], s[2], s[1], s[3]}, DType::f64).transpose(1, 2);
    };
    const Tensor dq2 = rows_first(q.shape()), dk2 = rows_first(k.shape()),
                 dv2 = rows_first(v.shape());
    for (const Tensor& t : {out, lse, dq2, dk2, dv2})
      test::poison(t);
    ASSERT_TRUE(kernels::packed_forward_as_padded(pp, q, k, v, out, lse, cpu_forward));
    ASSERT_TRUE(kernels::packed_backward_as_padded(pp, go, q, k, v, r.out, r.lse, dq2, dk2, dv2,
                                                   cpu_backward));
    EXPECT_TRUE(test::all_close(out, r.out, 1e-12, 1e-12)) << "out";
    EXPECT_TRUE(lse_close(lse, r.lse, 1e-12)) << "lse";
    EXPECT_TRUE(test::all_close(dq2, dq, 1e-12, 1e-12)) << "dq";
    EXPECT_TRUE(test::all_close(dk2, dk, 1e-12, 1e-12)) << "dk";
    EXPECT_TRUE(test::all_close(dv2, dv, 1e-12, 1e-12)) << "dv";
    // Not a vacuous comparison: the outputs are not all zero.
    EXPECT_GT(test::relative_error(r.out, zeros(r.out.shape(), DType::f64)), 0.5);
    EXPECT_GT(test::relative_error(dk, zeros(dk.shape(), DType::f64)), 0.5);
  }
}

TEST(CpuAttentionPacked, the_padded_form_has_one_sequence_per_document_with_queries) {
  const Tensor q = test::random_normal({1, 4, 12, 8}, DType::f64);
  const Tensor k = test::random_normal({1, 2, 26, 8}, DType::f64);
  AttentionOptions o;
  o.causal(MaskAlignment::bottom_right)
      .window(5)
      .varlen(offsets({0, 3, 3, 10, 12}), offsets({0, 7, 9, 20, 26}));
  const AttentionParams p = kernels::attention_params(q, k, k, o);
  const PackedAsPadded pp = kernels::packed_as_padded(p);
  ASSERT_EQ(pp.refusal, "");
  const AttentionParams& pd = pp.params;
  EXPECT_EQ(pd.B, 3);  // document 1 has no query
  EXPECT_EQ(pd.Tq, kernels::kPaddedLengthQuantum);
  EXPECT_EQ(pd.Tk, kernels::kPaddedLengthQuantum);
  EXPECT_EQ(pd.H, 4);
  EXPECT_EQ(pd.Hkv, 2);
  EXPECT_FALSE(pd.packed());
  ASSERT_TRUE(pd.padded());
  EXPECT_EQ(pd.seq_len_q.to_vector<int64_t>(), (std::vector<int64_t>{3, 7, 2}));
  EXPECT_EQ(pd.seq_len_kv.to_vector<int64_t>(), (std::vector<int64_t>{7, 11, 6}));
  EXPECT_TRUE(pd.causal);
  EXPECT_TRUE(pd.bottom_right);
  EXPECT_EQ(pd.window, 5);
  EXPECT_EQ(pd.scale, p.scale);
  // Packed query row 4 is row 1 of the second padded sequence; key 7 (of
  // the document without queries) reads the zero row past the padded keys.
  EXPECT_EQ(pp.q_back.to_vector<int64_t>()[4], kernels::kPaddedLengthQuantum + 1);
  EXPECT_EQ(pp.kv_back.to_vector<int64_t>()[7], 3 * kernels::kPaddedLengthQuantum);
  EXPECT_EQ(pp.kv_rows.to_vector<int64_t>()[kernels::kPaddedLengthQuantum + 2], 9 + 2);
}

// B', Tq' and Tk' are bucketed (powers of two and their 1.5 multiples, the
// lengths in units of 64), the extra sequences copies of the cheapest document.
TEST(CpuAttentionPacked, the_padded_form_is_bucketed) {
  // Five documents of 100, 1, 300, 20, 5 queries on 100, 2, 700, 20, 9 keys.
  const Tensor q = test::random_normal({1, 2, 426, 8}, DType::f64);
  const Tensor k = test::random_normal({1, 2, 831, 8}, DType::f64);
  AttentionOptions o;
  o.causal(MaskAlignment::bottom_right)
      .varlen(offsets({0, 100, 101, 401, 421, 426}), offsets({0, 100, 102, 802, 822, 831}));
  const PackedAsPadded pp = kernels::packed_as_padded(kernels::attention_params(q, k, k, o));
  ASSERT_EQ(pp.refusal, "");
  EXPECT_EQ(pp.params.B, 6);
  EXPECT_EQ(pp.params.Tq, 384);  // 300 -> 6 x 64
  EXPECT_EQ(pp.params.Tk, 768);  // 700 -> 12 x 64
  EXPECT_EQ(pp.params.seq_len_q.to_vector<int64_t>(),
            (std::vector<int64_t>{100, 1, 300, 20, 5, 1}));
  EXPECT_EQ(pp.params.seq_len_kv.to_vector<int64_t>(),
            (std::vector<int64_t>{100, 2, 700, 20, 9, 2}));
  // The copy reads document 1's rows, and nothing is read back from it.
  EXPECT_EQ(pp.q_rows.to_vector<int64_t>()[5 * 384], 100);
  EXPECT_EQ(pp.kv_rows.to_vector<int64_t>()[5 * 768 + 1], 101);
  for (int64_t back : pp.q_back.to_vector<int64_t>())
    EXPECT_LT(back, 5 * 384);
  for (int64_t back : pp.kv_back.to_vector<int64_t>())
    EXPECT_TRUE(back < 5 * 768 || back == 6 * 768) << back;
}

TEST(CpuAttentionPacked, a_refused_run_writes_nothing) {
  const Tensor q = test::random_normal({1, 2, 9, 8}, DType::f64);
  AttentionOptions o;
  o.causal().varlen(offsets({0, 4, 9}));
  const PackedAsPadded pp = kernels::packed_as_padded(kernels::attention_params(q, q, q, o));
  ASSERT_EQ(pp.refusal, "");
  const Tensor out = full(q.shape(), 7.0, DType::f64), lse = full({1, 2, 9}, 7.0, DType::f64);
  const auto refuse = [](const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                         const Tensor&, const Tensor&) { return false; };
  EXPECT_FALSE(kernels::packed_forward_as_padded(pp, q, q, q, out, lse, refuse));
  EXPECT_TRUE(test::all_equal(out, full(q.shape(), 7.0, DType::f64)));
  EXPECT_TRUE(test::all_equal(lse, full({1, 2, 9}, 7.0, DType::f64)));
}

TEST(CpuAttentionPacked, no_padded_form_with_dropout_a_bias_or_a_mask) {
  const Tensor q = test::random_normal({1, 2, 9, 8}, DType::f64);
  const Tensor cu = offsets({0, 4, 9});
  const auto refusal = [&](AttentionOptions o) {
    o.varlen(cu);
    return kernels::packed_as_padded(kernels::attention_params(q, q, q, o)).refusal;
  };
  EXPECT_THAT(refusal(AttentionOptions().dropout(0.1)), ::testing::HasSubstr("dropout"));
  EXPECT_THAT(refusal(AttentionOptions().bias(zeros({1, 1, 9, 9}, DType::f64))),
              ::testing::HasSubstr("bias"));
  EXPECT_THAT(refusal(AttentionOptions().mask(ones({1, 1, 9, 9}, DType::boolean))),
              ::testing::HasSubstr("mask"));
  EXPECT_EQ(refusal(AttentionOptions().causal()), "");
}

}  // namespace
}  // namespace accrue
