// The fused classifier's CUDA path (Note [Fused classifier]) against the CPU
// reference on the same inputs: f32 with TF32 off tightly, bf16/f16 from the
// same rounded inputs with tolerances by dtype; sum, count (exact), dlogits,
// and dh / dW through autograd with and without a gradient-arena slot; the
// row kernel's layouts (Note [Classifier row kernel]): widths that are not a
// multiple of its 16-byte packs, rows starting off a 16-byte boundary, rows
// wider than its register cache. Last, a GPT-2 sized vocabulary (50257
// classes padded to 50304) in bf16.
#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/allocator.h"
#include "accrue/kernels/classifier.h"
#ifdef ACCRUE_WITH_CUDA
#include "accrue/kernels/classifier_backend.h"
#endif
#include "accrue/kernels/ops.h"
#include "accrue/optim/param_store.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::CheckIndicesScope;
using test::close;
using test::Tf32Scope;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

Tensor on_cpu(const Tensor& t) {
  return t.to(kCpu);
}

::testing::AssertionResult near_scalar(const Tensor& actual, const Tensor& expected, double rtol) {
  const double a = actual.item(), e = expected.item();
  if (std::fabs(a - e) <= rtol * std::fabs(e)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " vs " << e << ": relative difference "
                                       << std::fabs(a - e) / std::fabs(e) << " > " << rtol;
}

// Targets in [0, valid) as `dtype`, every third one ignore_index.
Tensor some_ignored_targets(int64_t n, int64_t valid, int64_t ignore, DType dtype) {
  std::vector<int64_t> t =
      test::random_integers({n}, 0, static_cast<int>(valid - 1), DType::i64).to_vector<int64_t>();
  for (size_t i = 1; i < t.size(); i += 3)
    t[i] = ignore;
  return from_vector(t, {n}, dtype);
}

int64_t counted(const Tensor& targets, int64_t ignore) {
  int64_t c = 0;
  for (int64_t v : targets.to_vector<int64_t>())
    c += v != ignore;
  return c;
}

// The rows of ignored targets and the padded columns are exactly 0.
::testing::AssertionResult zero_where_required(const Tensor& dlogits, const Tensor& targets,
                                               int64_t valid, int64_t ignore) {
  const int64_t n = dlogits.size(0), padded = dlogits.size(1);
  const std::vector<double> d = on_cpu(dlogits).to_vector<double>();
  const std::vector<int64_t> t = on_cpu(targets).to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < padded; ++c)
      if ((c >= valid || t[i] == ignore) && d[i * padded + c] != 0.0)
        return ::testing::AssertionFailure()
               << "dlogits[" << i << ", " << c << "] = " << d[i * padded + c] << ", expected 0";
  return ::testing::AssertionSuccess();
}

// ---- forward ------------------------------------------------------------------------

// More rows than one chunk (Note [Classifier chunk rows]), so the seam is covered too.
TEST(GpuClassifier, f32_forward_matches_cpu_tightly_with_tf32_off) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const int64_t n = 4096 + 200, d = 64, padded = 1024, valid = 1000, ignore = -100;
  const Tensor h = test::random_normal({n, d}, DType::f32);
  const Tensor w = test::random_normal({padded, d}, DType::f32, kCpu, 0.2);
  for (DType it : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(it));
    const Tensor t = some_ignored_targets(n, valid, ignore, it);
    const kernels::ClassifierOutput cpu = kernels::classifier_forward(h, w, t, valid, ignore);
    Tensor h_gpu = h.to(kGpu), w_gpu = w.to(kGpu), t_gpu = t.to(kGpu);
    const kernels::ClassifierOutput gpu =
        kernels::classifier_forward(h_gpu, w_gpu, t_gpu, valid, ignore);
    EXPECT_EQ(gpu.sum.device(), kGpu);
    EXPECT_EQ(gpu.sum.dtype(), DType::f32);
    EXPECT_EQ(gpu.count.dtype(), DType::i64);
    EXPECT_EQ(gpu.dlogits.dtype(), DType::f32);
    EXPECT_EQ(gpu.count.item(), static_cast<double>(counted(t, ignore)));
    EXPECT_TRUE(near_scalar(gpu.sum, cpu.sum, 1e-5));
    EXPECT_TRUE(close(on_cpu(gpu.dlogits), cpu.dlogits, test::normalized_tolerance(DType::f32)));
    EXPECT_TRUE(zero_where_required(gpu.dlogits, t, valid, ignore));
  }
}

TEST(GpuClassifier, sixteen_bit_forward_matches_cpu_on_the_same_rounded_inputs) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 300, d = 64, padded = 512, valid = 500, ignore = 7;  // 7 is also a class
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor h = test::random_normal({n, d}, dt);
    const Tensor w = test::random_normal({padded, d}, dt, kCpu, 0.2);
    const Tensor t = some_ignored_targets(n, valid, ignore, DType::i64);
    const kernels::ClassifierOutput cpu = kernels::classifier_forward(h, w, t, valid, ignore);
    const kernels::ClassifierOutput gpu =
        kernels::classifier_forward(h.to(kGpu), w.to(kGpu), t.to(kGpu), valid, ignore);
    EXPECT_EQ(gpu.sum.dtype(), DType::f32);
    EXPECT_EQ(gpu.dlogits.dtype(), dt);
    EXPECT_EQ(gpu.count.item(), cpu.count.item());
    // The logits round to the same 16-bit values except at rare ties of fp32
    // vs double accumulation; the log-sum-exp is fp32 vs double.
    EXPECT_TRUE(near_scalar(gpu.sum, cpu.sum, 1e-4));
    EXPECT_TRUE(close(on_cpu(gpu.dlogits), cpu.dlogits, test::normalized_tolerance(dt)));
    EXPECT_TRUE(zero_where_required(gpu.dlogits, t, valid, ignore));
  }
}

TEST(GpuClassifier, forward_is_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 777, d = 96, padded = 2048, valid = 2000;
  const Tensor h = test::random_normal({n, d}, DType::bf16, kGpu);
  const Tensor w = test::random_normal({padded, d}, DType::bf16, kGpu, 0.1);
  const Tensor t = some_ignored_targets(n, valid, -100, DType::i64).to(kGpu);
  const kernels::ClassifierOutput a = kernels::classifier_forward(h, w, t, valid);
  const kernels::ClassifierOutput b = kernels::classifier_forward(h, w, t, valid);
  EXPECT_EQ(a.sum.item(), b.sum.item());
  EXPECT_TRUE(test::all_equal(on_cpu(a.dlogits), on_cpu(b.dlogits)));
}

TEST(GpuClassifier, empty_and_all_ignored_batches) {
  ACCRUE_REQUIRE_CUDA();
  kernels::ClassifierOutput out = kernels::classifier_forward(
      empty({0, 8}, DType::f32, kGpu), test::random_normal({16, 8}, DType::f32, kGpu),
      empty({0}, DType::i64, kGpu), 10);
  EXPECT_EQ(out.sum.item(), 0.0);
  EXPECT_EQ(out.count.item(), 0.0);
  const Tensor ignored = full({5}, -100.0, DType::i32, kGpu);
  out = kernels::classifier_forward(test::random_normal({5, 8}, DType::f32, kGpu),
                                    test::random_normal({16, 8}, DType::f32, kGpu), ignored, 10);
  EXPECT_EQ(out.sum.item(), 0.0);
  EXPECT_EQ(out.count.item(), 0.0);
  EXPECT_TRUE(test::all_equal(on_cpu(out.dlogits), zeros({5, 16})));
}

TEST(GpuClassifier, out_of_range_target_throws_or_shows_as_nan_without_checks) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor h = test::random_normal({4, 8}, DType::f32, kGpu);
  const Tensor w = test::random_normal({12, 8}, DType::f32, kGpu);
  // 10 is a padded class: out of the valid range [0, 10).
  const Tensor bad = from_vector<int64_t>({1, 10, 2, -100}, {4}, DType::i64, kGpu);
  {
    CheckIndicesScope checks(true);
    EXPECT_ERROR(kernels::classifier_forward(h, w, bad, 10), "classifier_forward", "target 10",
                 "[0, 10)");
  }
  CheckIndicesScope no_checks(false);
  const kernels::ClassifierOutput out = kernels::classifier_forward(h, w, bad, 10);
  EXPECT_TRUE(std::isnan(out.sum.item()));
  EXPECT_EQ(out.count.item(), 3.0);
}

// ---- the row kernel's layouts ---------------------------------------------------------

// The forward on the GPU against the CPU on the same inputs: count exactly,
// the sum and dlogits within the dtype's tolerance, the zeros exactly, and a
// second run bit for bit.
void expect_forward_matches_cpu(DType dt, int64_t n, int64_t d, int64_t padded, int64_t valid) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " padded " + std::to_string(padded) + " valid " +
               std::to_string(valid));
  const int64_t ignore = -100;
  const Tensor h = test::random_normal({n, d}, dt);
  const Tensor w = test::random_normal({padded, d}, dt, kCpu, 0.5);
  const Tensor t = some_ignored_targets(n, valid, ignore, DType::i64);
  const kernels::ClassifierOutput cpu = kernels::classifier_forward(h, w, t, valid, ignore);
  const Tensor h_gpu = h.to(kGpu), w_gpu = w.to(kGpu), t_gpu = t.to(kGpu);
  const kernels::ClassifierOutput gpu =
      kernels::classifier_forward(h_gpu, w_gpu, t_gpu, valid, ignore);
  EXPECT_EQ(gpu.count.item(), cpu.count.item());
  // 16-bit logits round to the same values except at rare ties (see above).
  const double sum_rtol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 1e-5 : 1e-4;
  EXPECT_TRUE(near_scalar(gpu.sum, cpu.sum, sum_rtol));
  EXPECT_TRUE(close(on_cpu(gpu.dlogits), cpu.dlogits, test::normalized_tolerance(dt)));
  EXPECT_TRUE(zero_where_required(gpu.dlogits, t, valid, ignore));
  const kernels::ClassifierOutput again =
      kernels::classifier_forward(h_gpu, w_gpu, t_gpu, valid, ignore);
  EXPECT_EQ(again.sum.item(), gpu.sum.item());
  EXPECT_TRUE(test::all_equal(on_cpu(again.dlogits), on_cpu(gpu.dlogits)));
}

// Widths that are not a multiple of a 16-byte pack (8 bf16/f16, 4 f32, 2
// f64): most rows start misaligned and have a scalar head and tail, some rows
// are narrower than one pack, and the padding starts anywhere in a row.
TEST(GpuClassifier, widths_not_a_multiple_of_the_pack_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const std::vector<std::pair<int64_t, int64_t>> widths = {{3, 2},   {7, 7},   {9, 5},
                                                           {13, 11}, {33, 30}, {1003, 997}};
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64})
    for (const auto& [padded, valid] : widths)
      expect_forward_matches_cpu(dt, 37, 16, padded, valid);
}

// Rows wider than the packs each thread keeps in registers (1024 x 7 packs:
// 57344 bf16/f16 or 28672 f32 columns; 512 x 4 packs: 4096 f64 columns): the
// packs past them are read twice. Odd widths, so misaligned rows too.
TEST(GpuClassifier, rows_wider_than_the_register_cache_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  expect_forward_matches_cpu(DType::bf16, 5, 16, 60007, 60001);
  expect_forward_matches_cpu(DType::f16, 5, 16, 58000, 57990);
  expect_forward_matches_cpu(DType::f32, 5, 16, 30001, 29999);
  expect_forward_matches_cpu(DType::f64, 5, 16, 5001, 4999);
}

#ifdef ACCRUE_WITH_CUDA
// Rows of a width that is a multiple of every pack, viewed one element into
// their buffer: every row starts off a 16-byte boundary, so it has a scalar
// head and tail around its packs. Only the backend can be given such a view
// (the forward's dlogits buffer is aligned). The CUDA rows match the CPU's,
// an ignored row is 0, a row with an out-of-range target (unchecked here) is
// NaN over the valid columns, and nothing outside the view is written.
TEST(GpuClassifier, rows_starting_off_a_16_byte_boundary_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t rows = 6, cols = 1024, valid = 1000, ignore = -100;
  // Row 0's target lies in the head of a 2-byte row, row 3's in its first
  // column, row 2's in the last valid one; row 4's is out of range.
  const Tensor targets = from_vector<int64_t>({5, ignore, 999, 0, 1000, 512}, {rows}, DType::i64);
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType loss_dtype = dt == DType::f64 ? DType::f64 : DType::f32;
    const Tensor buffer = test::random_normal({rows * cols + 2}, dt, kCpu, 3.0);
    const Tensor cpu = buffer.clone(), gpu = buffer.to(kGpu);
    const Tensor cpu_loss = empty({rows}, loss_dtype), gpu_loss = empty({rows}, loss_dtype, kGpu);
    kernels::cpu::classifier_rows(cpu.narrow(0, 1, rows * cols).view({rows, cols}), targets, valid,
                                  ignore, cpu_loss);
    kernels::cuda::classifier_rows(gpu.narrow(0, 1, rows * cols).view({rows, cols}),
                                   targets.to(kGpu), valid, ignore, gpu_loss);
    const Tensor got = on_cpu(gpu), got_loss = on_cpu(gpu_loss);
    EXPECT_TRUE(test::all_equal(got.narrow(0, 0, 1), buffer.narrow(0, 0, 1)));
    EXPECT_TRUE(
        test::all_equal(got.narrow(0, rows * cols + 1, 1), buffer.narrow(0, rows * cols + 1, 1)));
    auto row = [&](const Tensor& t, int64_t r) { return t.narrow(0, 1 + r * cols, cols); };
    for (int64_t r : {0, 2, 3, 5}) {
      SCOPED_TRACE("row " + std::to_string(r));
      EXPECT_TRUE(close(row(got, r), row(cpu, r), test::normalized_tolerance(dt)));
      EXPECT_TRUE(near_scalar(got_loss.narrow(0, r, 1), cpu_loss.narrow(0, r, 1),
                              dt == DType::f64 ? 1e-12 : 1e-5));
    }
    EXPECT_TRUE(test::all_equal(row(got, 1), zeros({cols}, dt)));
    EXPECT_EQ(got_loss.narrow(0, 1, 1).item(), 0.0);
    const std::vector<double> bad = row(got, 4).to_vector<double>();
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_TRUE(c < valid ? std::isnan(bad[c]) : bad[c] == 0.0) << "column " << c;
    EXPECT_TRUE(std::isnan(got_loss.narrow(0, 4, 1).item()));
  }
}
#endif

// ---- backward -----------------------------------------------------------------------

// Same dlogits on both sides (the CPU's), so only the backward differs.
TEST(GpuClassifier, backward_matches_cpu_and_writes_then_adds_an_f32_dweight) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const int64_t n = 300, d = 48, padded = 256, valid = 250;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor h = test::random_normal({n, d}, dt);
    const Tensor w = test::random_normal({padded, d}, dt, kCpu, 0.2);
    const Tensor t = some_ignored_targets(n, valid, -100, DType::i64);
    const Tensor dl = kernels::classifier_forward(h, w, t, valid).dlogits;
    const Tensor seed = scalar_tensor(0.75, DType::f32);
    const Tensor start = test::random_normal({padded, d}, DType::f32);
    Tensor dw_cpu = start.clone();
    Tensor dw_gpu = start.to(kGpu);
    test::poison(dw_gpu);  // beta 0 must not read it
    const Tensor dh_cpu = kernels::classifier_backward(dl, h, w, seed, true, dw_cpu, 0.0);
    const Tensor dh_gpu = kernels::classifier_backward(dl.to(kGpu), h.to(kGpu), w.to(kGpu),
                                                       seed.to(kGpu), true, dw_gpu, 0.0);
    EXPECT_EQ(dh_gpu.dtype(), dt);
    EXPECT_EQ(dh_gpu.device(), kGpu);
    const double dw_tol = dt == DType::f32 ? test::normalized_tolerance(DType::f32) : 1e-4;
    EXPECT_TRUE(close(on_cpu(dh_gpu), dh_cpu, test::normalized_tolerance(dt)));
    EXPECT_TRUE(close(on_cpu(dw_gpu), dw_cpu, dw_tol));
    kernels::classifier_backward(dl, h, w, seed, false, dw_cpu, 1.0);
    const Tensor none = kernels::classifier_backward(dl.to(kGpu), h.to(kGpu), w.to(kGpu),
                                                     seed.to(kGpu), false, dw_gpu, 1.0);
    EXPECT_FALSE(none.defined());
    EXPECT_TRUE(close(on_cpu(dw_gpu), dw_cpu, dw_tol));
    // The padded rows of the weight gradient stay exactly 0.
    EXPECT_TRUE(test::all_equal(on_cpu(dw_gpu).narrow(0, valid, padded - valid),
                                zeros({padded - valid, d})));
  }
}

TEST(GpuClassifier, autograd_without_arena_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  const int64_t d = 64, padded = 640, valid = 600;
  const Tensor h0 = test::random_normal({2, 150, d}, DType::f32);
  const Tensor w0 = test::random_normal({padded, d}, DType::f32, kCpu, 0.2);
  const Tensor t0 = some_ignored_targets(300, valid, -100, DType::i64).reshape({2, 150});
  const Tensor h_cpu = requires_grad_(h0.clone()), w_cpu = requires_grad_(w0.clone());
  const Tensor h_gpu = requires_grad_(h0.to(kGpu)), w_gpu = requires_grad_(w0.to(kGpu));
  const Loss cpu = classifier_cross_entropy(h_cpu, w_cpu, t0, valid);
  const Loss gpu = classifier_cross_entropy(h_gpu, w_gpu, t0.to(kGpu), valid);
  EXPECT_EQ(gpu.count.item(), cpu.count.item());
  EXPECT_TRUE(near_scalar(gpu.sum, cpu.sum, 1e-5));
  // The seed is a device scalar (a loss scale), never read on the host.
  backward(cpu.sum, scalar_tensor(0.5));
  backward(gpu.sum, scalar_tensor(0.5, DType::f32, kGpu));
  EXPECT_EQ(grad(h_gpu).shape(), h_gpu.shape());
  EXPECT_TRUE(close(on_cpu(grad(h_gpu)), grad(h_cpu), test::normalized_tolerance(DType::f32)));
  EXPECT_TRUE(close(on_cpu(grad(w_gpu)), grad(w_cpu), test::normalized_tolerance(DType::f32)));
}

// Note [Fused weight-gradient accumulation]: bf16 compute copy, fp32 slot,
// beta 0 on the window's first backward and beta 1 on the second.
TEST(GpuClassifier, autograd_arena_slot_is_written_then_accumulated) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 256, d = 64, padded = 1024, valid = 1000;
  const Tensor w = requires_grad_(test::random_normal({padded, d}, DType::f32, kGpu, 0.2));
  optim::ParamStore arena(
      {{"lm_head", w}},
      optim::ParamStoreOptions().device(kGpu).compute_dtype(DType::bf16).moments(0));
  ASSERT_EQ(w.dtype(), DType::bf16);  // re-pointed at the compute copy
  const Tensor h = requires_grad_(test::random_normal({n, d}, DType::bf16, kGpu));
  const Tensor t = some_ignored_targets(n, valid, -100, DType::i64);
  const Tensor seed = scalar_tensor(0.5, DType::f32, kGpu);

  // The reference: the CPU kernels on the same bf16 values, into an f32 dW.
  const Tensor h_cpu = on_cpu(detach(h)), w_cpu = on_cpu(detach(w));
  const kernels::ClassifierOutput ref = kernels::classifier_forward(h_cpu, w_cpu, t, valid);
  Tensor dw_ref = empty({padded, d}, DType::f32);
  const Tensor dh_ref = kernels::classifier_backward(ref.dlogits, h_cpu, w_cpu, scalar_tensor(0.5),
                                                     true, dw_ref, 0.0);

  test::poison(arena.grad_view(0));  // stale values that the first write must replace
  arena.begin_window();
  backward(classifier_cross_entropy(h, w, t.to(kGpu), valid).sum, seed);
  EXPECT_TRUE(arena.written(0));
  const Tensor once = on_cpu(arena.grad_view(0));
  EXPECT_EQ(once.dtype(), DType::f32);
  EXPECT_TRUE(close(once, dw_ref, 2e-3));
  EXPECT_TRUE(close(on_cpu(grad(h)), dh_ref, test::normalized_tolerance(DType::bf16)));
  backward(classifier_cross_entropy(h, w, t.to(kGpu), valid).sum, seed);
  EXPECT_TRUE(close(on_cpu(arena.grad_view(0)),
                    kernels::binary_scalar(kernels::BinaryOp::Mul, once, 2.0), 1e-5));
}

// ---- GPT-2's vocabulary --------------------------------------------------------------

// N = 1024 tokens, D = 768, V = 50257 padded to 50304, bf16. The whole batch
// is checked against the unfused GPU ops (matmul, cross_entropy); a few rows
// against the CPU reference (all of them would take minutes on the CPU).
TEST(GpuClassifier, gpt2_vocabulary_in_bf16) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 1024, d = 768, valid = 50257, padded = 50304, ignore = -100;
  const Tensor h = test::random_normal({n, d}, DType::bf16, kGpu);
  const Tensor w = test::random_normal({padded, d}, DType::bf16, kGpu, 0.05);
  const Tensor t_cpu = some_ignored_targets(n, valid, ignore, DType::i64);
  const Tensor t = t_cpu.to(kGpu);

  const int64_t before = memory_stats(kGpu).current_bytes;
  reset_peak_memory(kGpu);
  const kernels::ClassifierOutput fused = kernels::classifier_forward(h, w, t, valid, ignore);
  // No fp32 [N, V] logits (206 MB here) ever exist: the peak grows by the bf16
  // dlogits plus small buffers (and the GEMM's 32 MiB workspace on first use).
  const int64_t dlogits_bytes = n * padded * 2;
  EXPECT_LE(memory_stats(kGpu).peak_bytes - before, dlogits_bytes + (int64_t{48} << 20));
  EXPECT_EQ(fused.count.item(), static_cast<double>(counted(t_cpu, ignore)));
  EXPECT_TRUE(std::isfinite(fused.sum.item()));
  // Each counted row of softmax - onehot sums to 0 (NaN anywhere would show);
  // the bf16 rounding of p - 1 at the target allows about 2^-9.
  const std::vector<double> row_sums =
      kernels::sum(fused.dlogits.to(DType::f32), {1}).to_vector<double>();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(row_sums[i]), 1e-2) << "row " << i;
  EXPECT_TRUE(test::all_equal(on_cpu(fused.dlogits.narrow(1, valid, padded - valid).contiguous()),
                              zeros({n, padded - valid}, DType::bf16)));

  // The unfused ops on the same device.
  const Tensor logits = kernels::matmul(h, w.transpose(0, 1)).narrow(1, 0, valid);
  const kernels::LossSum plain = kernels::cross_entropy(logits, t, ignore);
  EXPECT_EQ(fused.count.item(), plain.count.item());
  EXPECT_TRUE(near_scalar(fused.sum, plain.sum, 1e-4));
  const Tensor dx =
      kernels::cross_entropy_backward(logits, t, ignore, scalar_tensor(1.0, DType::f32, kGpu));
  EXPECT_TRUE(close(on_cpu(fused.dlogits.narrow(1, 0, valid).contiguous()), on_cpu(dx),
                    test::normalized_tolerance(DType::bf16)));

  // A few rows on the CPU.
  const int64_t rows = 8;
  const kernels::ClassifierOutput cpu = kernels::classifier_forward(
      on_cpu(h.narrow(0, 0, rows)), on_cpu(w), t_cpu.narrow(0, 0, rows), valid, ignore);
  const kernels::ClassifierOutput gpu_rows =
      kernels::classifier_forward(h.narrow(0, 0, rows), w, t.narrow(0, 0, rows), valid, ignore);
  EXPECT_EQ(gpu_rows.count.item(), cpu.count.item());
  EXPECT_TRUE(near_scalar(gpu_rows.sum, cpu.sum, 1e-3));
  EXPECT_TRUE(close(on_cpu(fused.dlogits.narrow(0, 0, rows)), cpu.dlogits,
                    test::normalized_tolerance(DType::bf16)));
}

// Backward at GPT-2's size through autograd, the weight in an arena (bf16
// compute, fp32 slot), against the unfused autograd graph on the GPU.
TEST(GpuClassifier, gpt2_vocabulary_backward_through_the_arena) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 1024, d = 768, valid = 50257, padded = 50304;
  const Tensor w = requires_grad_(test::random_normal({padded, d}, DType::f32, kGpu, 0.05));
  optim::ParamStore arena(
      {{"lm_head", w}},
      optim::ParamStoreOptions().device(kGpu).compute_dtype(DType::bf16).moments(0));
  const Tensor h0 = test::random_normal({n, d}, DType::bf16, kGpu);
  const Tensor t = some_ignored_targets(n, valid, -100, DType::i64).to(kGpu);
  const Tensor seed = scalar_tensor(1024.0, DType::f32, kGpu);  // a loss scale

  const Tensor h = requires_grad_(h0.clone());
  arena.begin_window();
  backward(classifier_cross_entropy(h, w, t, valid).sum, seed);
  const Tensor dw = on_cpu(arena.grad_view(0));
  EXPECT_TRUE(test::all_equal(dw.narrow(0, valid, padded - valid).contiguous(),
                              zeros({padded - valid, d})));

  const Tensor h_ref = requires_grad_(h0.clone());
  const Tensor w_ref = requires_grad_(detach(w).clone());  // bf16, no arena
  const Tensor logits = narrow(matmul(h_ref, transpose(w_ref, 0, 1)), 1, 0, valid);
  backward(cross_entropy(logits, t).sum, seed);
  EXPECT_TRUE(
      close(dw, on_cpu(grad(w_ref)).to(DType::f32), test::normalized_tolerance(DType::bf16)));
  EXPECT_TRUE(close(on_cpu(grad(h)), on_cpu(grad(h_ref)), test::normalized_tolerance(DType::bf16)));
}

}  // namespace
}  // namespace accrue
