// The CPU matrix products (matmul with numpy semantics, gemm with alpha/beta)
// through kernels/ops.h, against an f64 triple loop written here.
#include <gmock/gmock.h>

#include <cmath>
#include <limits>

#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::all_close;
using test::all_equal;
using ::testing::HasSubstr;

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// numpy's matmul in f64: 1-D operands promoted and the added dim dropped,
// batch dims broadcast (materialized here with expand + a row-major read).
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  const Tensor a2 = a.dim() == 1 ? a.reshape({1, a.size(0)}) : a;
  const Tensor b2 = b.dim() == 1 ? b.reshape({b.size(0), 1}) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                 Shape(b2.shape().begin(), b2.shape().end() - 2), "reference");
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  const std::vector<double> va = values(a2.expand(sa)), vb = values(b2.expand(sb));
  const int64_t nb = shape_numel(batch);
  std::vector<double> r(static_cast<size_t>(nb * m * n), 0.0);
  for (int64_t p = 0; p < nb; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q)
          s += va[(p * m + i) * k + q] * vb[(p * k + q) * n + j];
        r[(p * m + i) * n + j] = s;
      }
  if (a.dim() > 1) so.push_back(m);
  if (b.dim() > 1) so.push_back(n);
  return from_vector<double>(r, so, DType::f64);
}

// Tolerance for a K-term dot product stored in dtype (the rounding of the
// inputs is already in the reference; this is the output's rounding).
::testing::AssertionResult close_product(const Tensor& actual, const Tensor& expected) {
  return all_close(actual, expected, test::default_rtol(actual.dtype()),
                   test::default_atol(actual.dtype()) * 4);
}

// ---- matmul -------------------------------------------------------------------------------

TEST(CpuMatmul, two_d_matches_reference_in_every_dtype) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = test::random_normal({5, 7}, dt);
    Tensor b = test::random_normal({7, 3}, dt);
    Tensor out = kernels::matmul(a, b);
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.shape(), (Shape{5, 3}));
    EXPECT_TRUE(close_product(out, reference_matmul(a, b)));
  }
}

TEST(CpuMatmul, integer_products_are_exact) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = test::random_integers({2, 4, 6}, -3, 3, dt);
    Tensor b = test::random_integers({2, 6, 5}, -3, 3, dt);
    EXPECT_TRUE(all_equal(kernels::matmul(a, b), reference_matmul(a, b)));
  }
  // Hand-computed.
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  EXPECT_EQ(kernels::matmul(a, b).to_vector<float>(), (std::vector<float>{58, 64, 139, 154}));
}

TEST(CpuMatmul, one_d_operands_follow_numpy) {
  Tensor v = test::random_normal({4}, DType::f64);
  Tensor w = test::random_normal({4}, DType::f64);
  Tensor m = test::random_normal({4, 3}, DType::f64);
  Tensor mt = test::random_normal({3, 4}, DType::f64);
  Tensor batched = test::random_normal({2, 4, 3}, DType::f64);
  Tensor batched_t = test::random_normal({2, 3, 4}, DType::f64);
  Tensor dot = kernels::matmul(v, w);
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_TRUE(all_close(dot, reference_matmul(v, w)));
  EXPECT_EQ(kernels::matmul(v, m).shape(), (Shape{3}));
  EXPECT_TRUE(all_close(kernels::matmul(v, m), reference_matmul(v, m)));
  EXPECT_EQ(kernels::matmul(mt, v).shape(), (Shape{3}));
  EXPECT_TRUE(all_close(kernels::matmul(mt, v), reference_matmul(mt, v)));
  EXPECT_EQ(kernels::matmul(v, batched).shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(kernels::matmul(v, batched), reference_matmul(v, batched)));
  EXPECT_EQ(kernels::matmul(batched_t, v).shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(kernels::matmul(batched_t, v), reference_matmul(batched_t, v)));
  // Hand-computed dot product.
  EXPECT_EQ(kernels::matmul(from_vector<float>({1, 2, 3}, {3}), from_vector<float>({4, 5, 6}, {3}))
                .item(),
            32.0);
}

TEST(CpuMatmul, batched_and_broadcast_batch_dims) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::pair<Shape, Shape> cases[] = {
        {{2, 3, 4, 5}, {2, 3, 5, 6}},  // plain batch
        {{2, 1, 4, 5}, {3, 5, 6}},     // size-1 and leading batch dims
        {{4, 5}, {2, 3, 5, 6}},        // a 2-D a broadcast over b's batch (0 batch stride)
        {{2, 3, 4, 5}, {5, 6}},        // and the other way round
        {{1, 4, 5}, {3, 1, 5, 2}},
    };
    for (const auto& [sa, sb] : cases) {
      SCOPED_TRACE(shape_str(sa) + " @ " + shape_str(sb));
      Tensor a = test::random_normal(sa, dt);
      Tensor b = test::random_normal(sb, dt);
      EXPECT_TRUE(close_product(kernels::matmul(a, b), reference_matmul(a, b)));
    }
  }
}

TEST(CpuMatmul, transposed_narrowed_and_expanded_operands) {
  Tensor at = test::random_normal({7, 5}, DType::f32).transpose(0, 1);  // [5, 7] column-major
  Tensor bt = test::random_normal({3, 7}, DType::f32).transpose(0, 1);  // [7, 3] column-major
  EXPECT_TRUE(close_product(kernels::matmul(at, bt), reference_matmul(at, bt)));
  // Batched transposes: [2, 5, 7] with the last two dims swapped.
  Tensor abt = test::random_normal({2, 7, 5}, DType::f64).transpose(1, 2);
  Tensor bb = test::random_normal({2, 7, 3}, DType::f64);
  EXPECT_TRUE(close_product(kernels::matmul(abt, bb), reference_matmul(abt, bb)));
  // Batch dims that do not merge into one stride (a permuted batch).
  Tensor ap = test::random_normal({3, 2, 4, 5}, DType::f64).permute({1, 0, 2, 3});  // [2, 3, 4, 5]
  Tensor bp = test::random_normal({2, 3, 5, 2}, DType::f64);
  EXPECT_TRUE(close_product(kernels::matmul(ap, bp), reference_matmul(ap, bp)));
  // Stride 2 along both dims: neither row- nor column-major, so copied.
  Tensor big = test::random_normal({10, 14}, DType::f32);
  Tensor strided = make_view(big, {5, 7}, {28, 2}, 1);
  EXPECT_TRUE(close_product(kernels::matmul(strided, bt), reference_matmul(strided, bt)));
  // Narrowed rows (leading dim larger than the row) and expanded rows (stride 0).
  Tensor narrowed = test::random_normal({5, 12}, DType::f32).narrow(1, 2, 7);
  Tensor expanded = test::random_normal({1, 7}, DType::f32).expand({5, 7});
  EXPECT_TRUE(close_product(kernels::matmul(narrowed, bt), reference_matmul(narrowed, bt)));
  EXPECT_TRUE(close_product(kernels::matmul(expanded, bt), reference_matmul(expanded, bt)));
  // Size-1 dims with odd strides: a [1, 7] row cut from a column, and a [7, 1] column.
  Tensor row = test::random_normal({7, 3}, DType::f32).narrow(1, 1, 1).transpose(0, 1);
  Tensor col = test::random_normal({7, 4}, DType::f32).narrow(1, 2, 1);
  EXPECT_TRUE(close_product(kernels::matmul(row, col), reference_matmul(row, col)));
  EXPECT_TRUE(close_product(kernels::matmul(col, row), reference_matmul(col, row)));
}

TEST(CpuMatmul, empty_operands) {
  EXPECT_EQ(kernels::matmul(zeros({0, 3}), zeros({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(kernels::matmul(zeros({2, 0, 3}), zeros({3, 4})).shape(), (Shape{2, 0, 4}));
  EXPECT_EQ(kernels::matmul(zeros({0, 2, 3}), zeros({3, 4})).shape(), (Shape{0, 2, 4}));
  // K == 0: an empty sum, so zeros.
  Tensor z = kernels::matmul(empty({2, 0}), empty({0, 3}));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(kernels::matmul(empty({0}), empty({0})).item(), 0.0);
}

TEST(CpuMatmul, bad_inputs_throw_naming_op_and_shapes) {
  EXPECT_ERROR(kernels::matmul(zeros({2, 3}), zeros({4, 5})),
               "matmul: inner dims differ: [2, 3] @ [4, 5]");
  EXPECT_ERROR(kernels::matmul(zeros({2, 3}), zeros({3, 5}, DType::bf16)),
               "matmul: dtypes f32 and bf16 differ");
  EXPECT_ERROR(kernels::matmul(zeros({2, 3}, DType::i64), zeros({3, 5}, DType::i64)), "matmul",
               "i64", "[2, 3]");
  EXPECT_ERROR(kernels::matmul(scalar_tensor(1.0), zeros({3})), "matmul", "[]", "[3]");
  EXPECT_ERROR(kernels::matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), "matmul", "[2, 2, 3]",
               "[3, 3, 4]", "broadcast");
  EXPECT_ERROR(kernels::matmul(zeros({3}), zeros({4})), "matmul: inner dims differ: [3] @ [4]");
  EXPECT_ERROR(kernels::matmul(Tensor(), zeros({4})), "matmul", "undefined");
}

// ---- gemm ---------------------------------------------------------------------------------

// alpha * op(a) @ op(b) + beta * c in f64.
Tensor reference_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
                      double alpha, double beta) {
  Tensor prod = reference_matmul(ta ? a.transpose(0, 1) : a, tb ? b.transpose(0, 1) : b);
  std::vector<double> p = values(prod), vc = values(c);
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = alpha * p[i] + (beta == 0.0 ? 0.0 : beta * vc[i]);
  return from_vector<double>(p, prod.shape(), DType::f64);
}

TEST(CpuGemm, alpha_beta_and_transpose_flags) {
  for (DType dt : kFloatTypes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " ta " << ta << " tb " << tb);
        Tensor a = test::random_normal(ta ? Shape{6, 4} : Shape{4, 6}, dt);
        Tensor b = test::random_normal(tb ? Shape{5, 6} : Shape{6, 5}, dt);
        Tensor out = test::random_normal({4, 5}, dt);
        Tensor expected = reference_gemm(a, ta, b, tb, out, 0.5, -1.5);
        kernels::gemm(a, ta, b, tb, out, 0.5, -1.5);
        EXPECT_TRUE(close_product(out, expected));
      }
    }
  }
}

TEST(CpuGemm, beta_zero_ignores_nan_in_out) {
  Tensor a = test::random_normal({3, 4}, DType::f32);
  Tensor b = test::random_normal({4, 2}, DType::f32);
  Tensor out = empty({3, 2});
  test::poison(out);
  kernels::gemm(a, false, b, false, out, 2.0, 0.0);
  EXPECT_TRUE(close_product(out, reference_gemm(a, false, b, false, out, 2.0, 0.0)));
}

TEST(CpuGemm, writes_then_accumulates_into_f32_from_16_bit_operands) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // The weight-gradient pattern: out [in, out] (=, then +=) x^T @ dy.
    Tensor x = test::random_integers({8, 3}, -4, 4, dt);
    Tensor dy = test::random_integers({8, 5}, -4, 4, dt);
    Tensor slot = empty({3, 5}, DType::f32);
    test::poison(slot);
    kernels::gemm(x, true, dy, false, slot, 1.0, 0.0);
    Tensor first = reference_gemm(x, true, dy, false, slot, 1.0, 0.0);
    EXPECT_TRUE(all_equal(slot, first));
    Tensor x2 = test::random_integers({8, 3}, -4, 4, dt);
    Tensor dy2 = test::random_integers({8, 5}, -4, 4, dt);
    kernels::gemm(x2, true, dy2, false, slot, 1.0, 1.0);
    EXPECT_TRUE(all_equal(slot, reference_gemm(x2, true, dy2, false, first, 1.0, 1.0)));
  }
  // Beyond bf16's 8 bits: the f32 slot keeps what a bf16 out would round away.
  Tensor a = full({1, 1}, 257.0, DType::bf16);  // rounds to 256 on creation
  Tensor one = full({1, 1}, 1.0, DType::bf16);
  Tensor slot = full({1, 1}, 1.0, DType::f32);
  kernels::gemm(a, false, one, false, slot, 1.0, 1.0);
  EXPECT_EQ(slot.item(), 257.0);
}

TEST(CpuGemm, strided_operands_and_empty_inner_dim) {
  Tensor a = test::random_normal({4, 9}, DType::f64).narrow(1, 1, 6);  // [4, 6], row stride 9
  Tensor b = test::random_normal({6, 5}, DType::f64);
  Tensor out = test::random_normal({4, 5}, DType::f64);
  Tensor expected = reference_gemm(a, false, b, false, out, 1.0, 1.0);
  kernels::gemm(a, false, b, false, out, 1.0, 1.0);
  EXPECT_TRUE(all_close(out, expected));
  // K == 0: out = beta * out.
  Tensor c = full({2, 3}, 4.0);
  kernels::gemm(empty({2, 0}), false, empty({0, 3}), false, c, 1.0, 0.5);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(6, 2.0f));
  test::poison(c);
  kernels::gemm(empty({2, 0}), false, empty({0, 3}), false, c, 1.0, 0.0);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(CpuGemm, bad_inputs_throw_naming_op_and_shapes) {
  EXPECT_ERROR(kernels::gemm(zeros({2, 3}), false, zeros({4, 5}), false, zeros({2, 5}), 1, 0),
               "gemm: inner dims differ", "[2, 3]", "[4, 5]");
  EXPECT_ERROR(kernels::gemm(zeros({3, 2}), true, zeros({3, 5}), false, zeros({2, 4}), 1, 0),
               "gemm: out shape [2, 4]", "[2, 5]");
  EXPECT_ERROR(
      kernels::gemm(zeros({2, 3}), false, zeros({3, 5}), false, zeros({2, 5}, DType::f64), 1, 0),
      "gemm", "out", "f64", "f32");
  EXPECT_ERROR(
      kernels::gemm(zeros({2, 3}, DType::bf16), false, zeros({3, 5}), false, zeros({2, 5}), 1, 0),
      "gemm: dtypes bf16 and f32 differ");
  EXPECT_ERROR(kernels::gemm(zeros({2, 3}), false, zeros({3, 5}), false,
                             zeros({5, 2}).transpose(0, 1), 1, 0),
               "gemm", "out", "contiguous");
  EXPECT_ERROR(kernels::gemm(zeros({1, 2, 3}), false, zeros({3, 5}), false, zeros({2, 5}), 1, 0),
               "gemm", "2-D", "[1, 2, 3]");
}

TEST(CpuGemm, tf32_switch_defaults_off) {
  EXPECT_FALSE(kernels::allow_tf32());
  kernels::set_allow_tf32(true);
  EXPECT_TRUE(kernels::allow_tf32());
  kernels::set_allow_tf32(false);
}

// Note [GEMM SM margin]: per device, off by default; values outside the
// ranges are refused with the device and the value named, leaving the margin
// as it was. (The GPU plans under a margin: GpuMatmul.sm_margin_*.)
TEST(GemmSmMargin, defaults_off_is_kept_per_device_and_refuses_bad_values) {
  EXPECT_EQ(kernels::gemm_sm_margin(0), 0);
  EXPECT_EQ(kernels::gemm_sm_margin(3), 0);
  kernels::set_gemm_sm_margin(3, 24);
  EXPECT_EQ(kernels::gemm_sm_margin(3), 24);
  EXPECT_EQ(kernels::gemm_sm_margin(0), 0) << "another device keeps its own";
  EXPECT_ERROR(kernels::set_gemm_sm_margin(3, -1), "set_gemm_sm_margin", "-1", "device 3",
               "[0, 1024)");
  EXPECT_ERROR(kernels::set_gemm_sm_margin(3, 1024), "set_gemm_sm_margin", "1024", "[0, 1024)");
  EXPECT_ERROR(kernels::set_gemm_sm_margin(64, 8), "set_gemm_sm_margin", "device 64", "[0, 64)");
  EXPECT_ERROR(kernels::set_gemm_sm_margin(-1, 8), "set_gemm_sm_margin", "device -1");
  EXPECT_ERROR(kernels::gemm_sm_margin(64), "gemm_sm_margin", "device 64");
  EXPECT_EQ(kernels::gemm_sm_margin(3), 24) << "a refused value changes nothing";
  kernels::set_gemm_sm_margin(3, 0);
  EXPECT_EQ(kernels::gemm_sm_margin(3), 0);
}

}  // namespace
}  // namespace accrue
