// The fused classifier's CPU reference (Note [Fused classifier]) against a
// plain f64 computation and against the unfused cross_entropy(h @ W^T[:, :V]).
#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <vector>

#include "accrue/kernels/classifier.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// The classifier computed plainly in f64 from the inputs' values: logits =
// h @ W^T, log_softmax over the first `valid` columns, loss = -logp[target]
// summed over the rows that are not ignored, dlogits = softmax - onehot (0 in
// padded columns and ignored rows).
struct Reference {
  double sum = 0.0;
  int64_t count = 0;
  std::vector<double> dlogits;  // [n, padded]
};

Reference reference(const Tensor& hidden, const Tensor& weight, const std::vector<int64_t>& t,
                    int64_t valid, int64_t ignore) {
  const int64_t n = hidden.size(0), d = hidden.size(1), padded = weight.size(0);
  const std::vector<double> h = values(hidden), w = values(weight);
  Reference r;
  r.dlogits.assign(static_cast<size_t>(n * padded), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    std::vector<double> logits(static_cast<size_t>(valid));
    double m = -INFINITY;
    for (int64_t c = 0; c < valid; ++c) {
      double z = 0;
      for (int64_t k = 0; k < d; ++k)
        z += h[i * d + k] * w[c * d + k];
      logits[c] = z;
      m = std::max(m, z);
    }
    double s = 0;
    for (int64_t c = 0; c < valid; ++c)
      s += std::exp(logits[c] - m);
    const double lse = m + std::log(s);
    r.sum += lse - logits[t[i]];
    ++r.count;
    for (int64_t c = 0; c < valid; ++c)
      r.dlogits[i * padded + c] = std::exp(logits[c] - lse) - (c == t[i] ? 1.0 : 0.0);
  }
  return r;
}

Tensor f64_tensor(const std::vector<double>& v, const Shape& shape) {
  return from_vector(v, shape, DType::f64);
}

// Targets in [0, valid) with every third row ignore_index.
std::vector<int64_t> some_ignored_targets(int64_t n, int64_t valid, int64_t ignore) {
  std::vector<int64_t> t =
      test::random_integers({n}, 0, static_cast<int>(valid - 1), DType::i64).to_vector<int64_t>();
  for (size_t i = 1; i < t.size(); i += 3)
    t[i] = ignore;
  return t;
}

TEST(CpuClassifier, forward_matches_plain_f64_with_padding_and_ignored_rows) {
  const int64_t n = 9, d = 6, padded = 16, valid = 11, ignore = -100;
  for (DType it : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(it));
    const Tensor h = test::random_normal({n, d}, DType::f64);
    const Tensor w = test::random_normal({padded, d}, DType::f64, Device::cpu(), 0.5);
    const std::vector<int64_t> t = some_ignored_targets(n, valid, ignore);
    const kernels::ClassifierOutput out =
        kernels::classifier_forward(h, w, from_vector(t, {n}, it), valid, ignore);
    const Reference ref = reference(h, w, t, valid, ignore);
    EXPECT_EQ(out.sum.dim(), 0);
    EXPECT_EQ(out.sum.dtype(), DType::f64);
    EXPECT_EQ(out.count.dtype(), DType::i64);
    EXPECT_EQ(out.count.item(), static_cast<double>(ref.count));
    EXPECT_NEAR(out.sum.item(), ref.sum, 1e-12 * std::fabs(ref.sum));
    EXPECT_EQ(out.dlogits.shape(), Shape({n, padded}));
    EXPECT_EQ(out.dlogits.dtype(), DType::f64);
    EXPECT_TRUE(test::all_close(out.dlogits, f64_tensor(ref.dlogits, {n, padded}), 1e-12, 1e-14));
    // Padded columns and ignored rows are exactly 0.
    const std::vector<double> dl = values(out.dlogits);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < padded; ++c)
        if (c >= valid || t[i] == ignore) {
          EXPECT_EQ(dl[i * padded + c], 0.0) << i << ", " << c;
        }
  }
}

TEST(CpuClassifier, forward_in_f32_matches_plain_f64) {
  const int64_t n = 12, d = 32, padded = 64, valid = 50;
  const Tensor h = test::random_normal({n, d}, DType::f32);
  const Tensor w = test::random_normal({padded, d}, DType::f32, Device::cpu(), 0.3);
  const std::vector<int64_t> t = some_ignored_targets(n, valid, -1);
  const kernels::ClassifierOutput out =
      kernels::classifier_forward(h, w, from_vector(t, {n}, DType::i64), valid, -1);
  const Reference ref = reference(h, w, t, valid, -1);
  EXPECT_EQ(out.sum.dtype(), DType::f32);
  EXPECT_EQ(out.dlogits.dtype(), DType::f32);
  EXPECT_EQ(out.count.item(), static_cast<double>(ref.count));
  EXPECT_NEAR(out.sum.item(), ref.sum, 1e-5 * std::fabs(ref.sum));
  EXPECT_LE(test::relative_error(out.dlogits, f64_tensor(ref.dlogits, {n, padded})), 1e-5);
}

TEST(CpuClassifier, padded_rows_of_the_weight_never_affect_the_loss) {
  const int64_t n = 8, d = 5, padded = 12, valid = 7;
  const Tensor h = test::random_normal({n, d}, DType::f64);
  const Tensor w = test::random_normal({padded, d}, DType::f64);
  // The same valid rows; padded rows that would dominate any softmax they entered.
  Tensor w_big = w.clone();
  w_big.narrow(0, valid, padded - valid).fill_(1e3);
  const Tensor t = from_vector(some_ignored_targets(n, valid, -100), {n}, DType::i64);
  const kernels::ClassifierOutput a = kernels::classifier_forward(h, w, t, valid);
  const kernels::ClassifierOutput b = kernels::classifier_forward(h, w_big, t, valid);
  EXPECT_EQ(a.sum.item(), b.sum.item());
  EXPECT_TRUE(test::all_equal(a.dlogits, b.dlogits));
  EXPECT_TRUE(test::all_equal(b.dlogits.narrow(1, valid, padded - valid),
                              zeros({n, padded - valid}, DType::f64)));
}

// The fused op equals the unfused composition on the CPU: the same GEMM (same
// backend, same accumulation order), so the same rounded logits in every
// dtype, the same double log-sum-exp, hence bit-identical dlogits; the loss
// sum differs only by the per-row rounding to f32 of the fused row losses.
TEST(CpuClassifier, equals_cross_entropy_of_the_sliced_matmul_in_every_dtype) {
  const int64_t n = 10, d = 24, padded = 40, valid = 33, ignore = 3;  // ignore_index 3 is a class
  for (DType dt : kFloatTypes) {
    for (DType it : {DType::i32, DType::i64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(it));
      const Tensor h = test::random_normal({n, d}, dt);
      const Tensor w = test::random_normal({padded, d}, dt, Device::cpu(), 0.4);
      std::vector<int64_t> tv = some_ignored_targets(n, valid, ignore);
      tv[0] = valid - 1;  // the last valid class
      const Tensor t = from_vector(tv, {n}, it);
      const kernels::ClassifierOutput fused = kernels::classifier_forward(h, w, t, valid, ignore);
      const Tensor logits = kernels::matmul(h, w.transpose(0, 1)).narrow(1, 0, valid);
      const kernels::LossSum loss = kernels::cross_entropy(logits, t, ignore);
      EXPECT_EQ(fused.count.item(), loss.count.item());
      EXPECT_NEAR(fused.sum.item(), loss.sum.item(),
                  (dt == DType::f64 ? 1e-13 : 1e-6) * std::fabs(loss.sum.item()));
      const Tensor dx =
          kernels::cross_entropy_backward(logits, t, ignore, scalar_tensor(1.0, DType::f64));
      EXPECT_TRUE(test::all_equal(fused.dlogits.narrow(1, 0, valid).contiguous(), dx));
    }
  }
}

// More rows than one chunk (Note [Classifier chunk rows]): the chunk seam is invisible.
TEST(CpuClassifier, rows_across_chunks_match_the_unfused_op) {
  const int64_t n = 4096 + 37, d = 3, padded = 8, valid = 6;
  const Tensor h = test::random_normal({n, d}, DType::f32);
  const Tensor w = test::random_normal({padded, d}, DType::f32);
  const Tensor t = from_vector(some_ignored_targets(n, valid, -100), {n}, DType::i64);
  const kernels::ClassifierOutput fused = kernels::classifier_forward(h, w, t, valid);
  const Tensor logits = kernels::matmul(h, w.transpose(0, 1)).narrow(1, 0, valid);
  const kernels::LossSum loss = kernels::cross_entropy(logits, t);
  EXPECT_EQ(fused.count.item(), loss.count.item());
  EXPECT_NEAR(fused.sum.item(), loss.sum.item(), 1e-6 * std::fabs(loss.sum.item()));
  EXPECT_TRUE(test::all_equal(
      fused.dlogits.narrow(1, 0, valid).contiguous(),
      kernels::cross_entropy_backward(logits, t, -100, scalar_tensor(1.0, DType::f64))));
}

TEST(CpuClassifier, strided_hidden_and_weight_views) {
  const int64_t n = 6, d = 4, padded = 9, valid = 9;  // no padding at all
  const Tensor h = test::random_normal({d, n}, DType::f64).transpose(0, 1);
  const Tensor w = test::random_normal({d, padded}, DType::f64).transpose(0, 1);
  const std::vector<int64_t> t = some_ignored_targets(n, valid, -100);
  const kernels::ClassifierOutput out =
      kernels::classifier_forward(h, w, from_vector(t, {n}, DType::i64), valid);
  const Reference ref = reference(h, w, t, valid, -100);
  EXPECT_NEAR(out.sum.item(), ref.sum, 1e-12 * std::fabs(ref.sum));
  EXPECT_TRUE(test::all_close(out.dlogits, f64_tensor(ref.dlogits, {n, padded}), 1e-12, 1e-14));
}

TEST(CpuClassifier, large_logits_are_stable) {
  const Tensor h = from_vector<float>({100, 0, -100, 3}, {2, 2});
  const Tensor w = from_vector<float>({10, 0, 10.01f, 0, 0, 10, 5, 5}, {4, 2});
  const Tensor t = from_vector<int64_t>({1, 2}, {2});
  const kernels::ClassifierOutput out = kernels::classifier_forward(h, w, t, 3);
  EXPECT_TRUE(std::isfinite(out.sum.item()));
  const Reference ref = reference(h, w, {1, 2}, 3, -100);
  EXPECT_NEAR(out.sum.item(), ref.sum, 1e-3);
  for (double v : values(out.dlogits))
    EXPECT_TRUE(std::isfinite(v));
}

TEST(CpuClassifier, empty_batches_and_all_ignored_rows) {
  kernels::ClassifierOutput out =
      kernels::classifier_forward(zeros({0, 4}), zeros({6, 4}), zeros({0}, DType::i64), 5);
  EXPECT_EQ(out.sum.item(), 0.0);
  EXPECT_EQ(out.count.item(), 0.0);
  EXPECT_EQ(out.dlogits.shape(), Shape({0, 6}));
  const Tensor all_ignored = from_vector<int64_t>({-100, -100, -100}, {3});
  out = kernels::classifier_forward(test::random_normal({3, 4}), test::random_normal({6, 4}),
                                    all_ignored, 5);
  EXPECT_EQ(out.sum.item(), 0.0);
  EXPECT_EQ(out.count.item(), 0.0);
  EXPECT_TRUE(test::all_equal(out.dlogits, zeros({3, 6})));
  // D = 0: every logit is 0, each counted row costs log(valid_classes).
  out = kernels::classifier_forward(zeros({2, 0}, DType::f64), zeros({6, 0}, DType::f64),
                                    from_vector<int64_t>({4, 0}, {2}), 5);
  EXPECT_NEAR(out.sum.item(), 2.0 * std::log(5.0), 1e-14);
}

// classifier_backward: dh = g * dlogits @ W, dW (= or +=) g * dlogits^T @ h.
TEST(CpuClassifier, backward_scales_by_the_seed_and_writes_then_adds_dweight) {
  const int64_t n = 7, d = 5, padded = 10, valid = 8;
  const Tensor h = test::random_normal({n, d}, DType::f64);
  const Tensor w = test::random_normal({padded, d}, DType::f64);
  const Tensor t = from_vector(some_ignored_targets(n, valid, -100), {n}, DType::i64);
  const kernels::ClassifierOutput out = kernels::classifier_forward(h, w, t, valid);
  const double g = 0.375;
  const Tensor seed = scalar_tensor(g, DType::f32);  // another dtype than the loss: converted
  Tensor dw = full({padded, d}, 123.0, DType::f64);  // stale values that beta 0 must replace
  const Tensor dh = kernels::classifier_backward(out.dlogits, h, w, seed, true, dw, 0.0);
  const Tensor expected_dh =
      kernels::binary_scalar(kernels::BinaryOp::Mul, kernels::matmul(out.dlogits, w), g);
  const Tensor expected_dw = kernels::binary_scalar(
      kernels::BinaryOp::Mul, kernels::matmul(out.dlogits.transpose(0, 1), h), g);
  EXPECT_TRUE(test::all_close(dh, expected_dh, 1e-12, 1e-14));
  EXPECT_TRUE(test::all_close(dw, expected_dw, 1e-12, 1e-14));
  // The padded rows of W get exactly 0.
  EXPECT_TRUE(
      test::all_equal(dw.narrow(0, valid, padded - valid), zeros({padded - valid, d}, DType::f64)));
  // beta 1 adds; no dh asked for: undefined.
  const Tensor none = kernels::classifier_backward(out.dlogits, h, w, seed, false, dw, 1.0);
  EXPECT_FALSE(none.defined());
  EXPECT_TRUE(test::all_close(dw, kernels::binary_scalar(kernels::BinaryOp::Mul, expected_dw, 2.0),
                              1e-12, 1e-14));
  // A [1] seed works like a 0-d one.
  EXPECT_TRUE(test::all_close(kernels::classifier_backward(
                                  out.dlogits, h, w, full({1}, g, DType::f64), true, Tensor(), 0.0),
                              expected_dh, 1e-12, 1e-14));
}

// 16-bit compute with an fp32 weight gradient (an arena slot), in one rounding.
TEST(CpuClassifier, backward_16_bit_inputs_write_an_f32_dweight) {
  const int64_t n = 6, d = 8, padded = 12, valid = 10;
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor h = test::random_normal({n, d}, dt);
    const Tensor w = test::random_normal({padded, d}, dt);
    const Tensor t = from_vector(some_ignored_targets(n, valid, -100), {n}, DType::i32);
    const kernels::ClassifierOutput out = kernels::classifier_forward(h, w, t, valid);
    const Tensor seed = scalar_tensor(2.0, DType::f32);  // a power of two: exact scaling
    Tensor dw = empty({padded, d}, DType::f32);
    const Tensor dh = kernels::classifier_backward(out.dlogits, h, w, seed, true, dw, 0.0);
    EXPECT_EQ(dh.dtype(), dt);
    Tensor expected_dw = empty({padded, d}, DType::f32);
    kernels::gemm(out.dlogits, true, h, false, expected_dw, 2.0, 0.0);
    EXPECT_TRUE(test::all_equal(dw, expected_dw));
    Tensor expected_dh = empty({n, d}, DType::f32);
    kernels::gemm(out.dlogits, false, w, false, expected_dh, 2.0, 0.0);
    EXPECT_TRUE(test::all_equal(dh, expected_dh.to(dt)));
  }
}

TEST(CpuClassifier, bad_inputs_throw_naming_op_and_values) {
  const Tensor h = zeros({4, 3}), w = zeros({8, 3});
  const Tensor t = from_vector<int64_t>({0, 1, 2, -100}, {4});
  const char* op = "classifier_forward";
  EXPECT_ERROR(kernels::classifier_forward(h, zeros({8, 5}), t, 6), op, "weight of shape [8, 5]",
               "hidden of shape [4, 3]");
  EXPECT_ERROR(kernels::classifier_forward(h, zeros({8, 3}, DType::f64), t, 6), op, "f32", "f64");
  EXPECT_ERROR(
      kernels::classifier_forward(zeros({4, 3}, DType::i64), zeros({8, 3}, DType::i64), t, 6), op,
      "hidden", "i64");
  EXPECT_ERROR(kernels::classifier_forward(zeros({2, 2, 3}), w, t, 6), op, "2-D", "[2, 2, 3]");
  EXPECT_ERROR(kernels::classifier_forward(h, w, zeros({3}, DType::i64), 6), op,
               "targets of shape [3]", "[4, 3]");
  EXPECT_ERROR(kernels::classifier_forward(h, w, zeros({4}), 6), op, "targets", "f32");
  EXPECT_ERROR(kernels::classifier_forward(h, w, t, 9), op, "valid_classes 9", "[1, 8]");
  EXPECT_ERROR(kernels::classifier_forward(h, w, t, 0), op, "valid_classes 0", "[1, 8]");
  EXPECT_ERROR(kernels::classifier_forward(h, w, t, -2), op, "valid_classes -2");
  // A padded class is not a valid target; neither is a negative one other than ignore_index.
  EXPECT_ERROR(kernels::classifier_forward(h, w, from_vector<int64_t>({0, 6, 1, 2}, {4}), 6), op,
               "target 6", "[0, 6)", "flat position 1");
  EXPECT_ERROR(
      kernels::classifier_forward(h, w, from_vector<int32_t>({0, 1, -1, 2}, {4}, DType::i32), 6),
      op, "target -1", "[0, 6)", "-100");
  EXPECT_ERROR(kernels::classifier_forward(Tensor(), w, t, 6), op, "hidden", "undefined");

  const kernels::ClassifierOutput out = kernels::classifier_forward(h, w, t, 6);
  const char* bop = "classifier_backward";
  const Tensor g = scalar_tensor(1.0);
  EXPECT_ERROR(kernels::classifier_backward(out.dlogits, h, w, zeros({2}), true, Tensor(), 0.0),
               bop, "grad_sum", "[2]");
  EXPECT_ERROR(kernels::classifier_backward(zeros({4, 7}), h, w, g, true, Tensor(), 0.0), bop,
               "dlogits of shape [4, 7]", "[4, 8]");
  EXPECT_ERROR(
      kernels::classifier_backward(out.dlogits, h, w, g, false, zeros({8, 3}, DType::f64), 0.0),
      bop, "dweight", "f64");
  EXPECT_ERROR(kernels::classifier_backward(out.dlogits, h, w, g, false, zeros({8, 2}), 0.0), bop,
               "dweight of shape [8, 2]", "[8, 3]");
  EXPECT_ERROR(kernels::classifier_backward(out.dlogits, h, w, g, false, zeros({8, 3}), 0.5), bop,
               "beta 0.5");
}

}  // namespace
}  // namespace accrue
