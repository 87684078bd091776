// The CUDA neural-network kernels (embedding, cross-entropy, layer norm, and
// their backwards) against the CPU reference: the same public API on CPU
// tensors and on GPU copies of them, with fresh random inputs. Gathers and
// sums of small integers are exact, so those compare bit for bit; the
// reductions are also run twice to show that the GPU gives the same bits.
#include <gmock/gmock.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "accrue/kernels/batch_norm.h"
#include "accrue/kernels/conv.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::close;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

Tensor on_cpu(const Tensor& t) {
  return t.to(kCpu);
}

// Indices in [0, vocab) as `dtype`, with a few hot rows repeated many times
// (like padding or frequent tokens): the worst case for a scatter-add.
Tensor repeated_indices(int64_t n, int64_t vocab, DType dtype) {
  std::vector<int64_t> v =
      test::random_integers({n}, 0, static_cast<int>(vocab - 1), DType::i64).to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); i += 3)
    v[i] = 7;  // one row gets a third of all positions
  for (size_t i = 1; i < v.size(); i += 11)
    v[i] = vocab - 1;
  return from_vector(v, {n}, dtype);
}

// ---- embedding -------------------------------------------------------------------

TEST(GpuEmbedding, forward_gathers_exactly_for_every_dtype_and_row_size) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (int64_t d : {768, 5, 1, 129}) {
      for (DType it : {DType::i64, DType::i32}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d) + " " +
                     dtype_name(it));
        const Tensor weight = test::random_normal({1000, d}, dt);
        const Tensor idx = test::random_integers({4, 64}, 0, 999, it);
        const Tensor expected = kernels::embedding(weight, idx);
        EXPECT_TRUE(
            test::all_equal(on_cpu(kernels::embedding(weight.to(kGpu), idx.to(kGpu))), expected));
        // A weight starting one row in: the base address loses its 16-byte
        // alignment for odd row sizes, so the copy must use narrower chunks.
        const Tensor shifted = weight.narrow(0, 1, 999);
        const Tensor small_idx = test::random_integers({33}, 0, 998, it);
        EXPECT_TRUE(test::all_equal(
            on_cpu(kernels::embedding(weight.to(kGpu).narrow(0, 1, 999), small_idx.to(kGpu))),
            kernels::embedding(shifted, small_idx)));
      }
    }
  }
}

TEST(GpuEmbedding, out_of_range_index_throws) {
  ACCRUE_REQUIRE_CUDA();
  ASSERT_TRUE(kernels::check_indices());
  const Tensor weight = test::random_normal({10, 4}, DType::f32, kGpu);
  const Tensor idx = from_vector<int64_t>({1, 2, 10, 3}, {4}, DType::i64, kGpu);
  EXPECT_THROW(kernels::embedding(weight, idx), Error);
  const Tensor negative = from_vector<int64_t>({-1}, {1}, DType::i32, kGpu);
  EXPECT_THROW(kernels::embedding(weight, negative), Error);
}

TEST(GpuEmbedding, backward_sums_small_integers_exactly) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t n = 4096, vocab = 1000;
  struct Case {
    DType grad, weight;
  };
  // bf16 grads summed into an fp32 arena slot is the training case.
  const Case cases[] = {{DType::f32, DType::f32},
                        {DType::bf16, DType::f32},
                        {DType::f16, DType::f32},
                        {DType::f64, DType::f64},
                        {DType::bf16, DType::bf16}};
  for (const Case& c : cases) {
    for (int64_t d : {768, 33}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(c.grad)) + " -> " + dtype_name(c.weight) +
                     " d=" + std::to_string(d) + (accumulate ? " accumulate" : " overwrite"));
        const Tensor grad = test::random_integers({n, d}, -3, 3, c.grad);
        const Tensor idx = repeated_indices(n, vocab, DType::i64);
        // Existing values to add to; NaN when overwriting (rows no index hits must become 0).
        Tensor expected = test::random_integers({vocab, d}, -50, 50, c.weight);
        if (!accumulate) test::poison(expected);
        Tensor actual = expected.to(kGpu);
        kernels::embedding_backward(grad, idx, expected, accumulate);
        kernels::embedding_backward(grad.to(kGpu), idx.to(kGpu), actual, accumulate);
        EXPECT_TRUE(test::all_equal(on_cpu(actual), expected));
      }
    }
  }
}

TEST(GpuEmbedding, backward_is_deterministic_and_matches_cpu_on_random_grads) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t vocab = 512, d = 768;
  const Tensor grad = test::random_normal({8, 512, d});
  const Tensor idx = repeated_indices(8 * 512, vocab, DType::i32).view({8, 512});
  const Tensor grad_gpu = grad.to(kGpu), idx_gpu = idx.to(kGpu);
  Tensor expected = empty({vocab, d});
  kernels::embedding_backward(grad, idx, expected, false);
  Tensor first = empty({vocab, d}, DType::f32, kGpu);
  Tensor second = empty({vocab, d}, DType::f32, kGpu);
  test::poison(first);
  test::poison(second);
  kernels::embedding_backward(grad_gpu, idx_gpu, first, false);
  kernels::embedding_backward(grad_gpu, idx_gpu, second, false);
  EXPECT_TRUE(test::all_equal(on_cpu(second), on_cpu(first)));
  EXPECT_TRUE(close(on_cpu(first), expected, 1e-5));
  // Accumulating a second micro-batch onto the first.
  kernels::embedding_backward(grad, idx, expected, true);
  kernels::embedding_backward(grad_gpu, idx_gpu, first, true);
  EXPECT_TRUE(close(on_cpu(first), expected, 1e-5));
}

// ---- cross-entropy ------------------------------------------------------------------

// Targets in [0, classes) with about a quarter set to ignore_index.
Tensor targets_with_ignored(int64_t rows, int64_t classes, int64_t ignore_index, DType dtype) {
  std::vector<int64_t> t =
      test::random_integers({rows}, 0, static_cast<int>(classes - 1), DType::i64)
          .to_vector<int64_t>();
  const std::vector<int64_t> coin =
      test::random_integers({rows}, 0, 3, DType::i64).to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); ++i)
    if (coin[i] == 0) t[i] = ignore_index;
  return from_vector(t, {rows}, dtype);
}

TEST(GpuCrossEntropy, forward_matches_cpu_with_ignored_targets) {
  ACCRUE_REQUIRE_CUDA();
  struct Case {
    int64_t rows, classes;
  };
  // GPT-2's padded vocabulary (one block per row), and a small one.
  const Case cases[] = {{64, 50304}, {1000, 10}, {37, 1}, {5, 1027}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      for (DType it : {DType::i64, DType::i32}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(c.rows) + "x" +
                     std::to_string(c.classes) + " " + dtype_name(it));
        const Tensor logits = test::random_normal({c.rows, c.classes}, dt, kCpu, 3.0);
        const Tensor targets = targets_with_ignored(c.rows, c.classes, -100, it);
        const kernels::LossSum expected = kernels::cross_entropy(logits, targets, -100);
        const kernels::LossSum actual =
            kernels::cross_entropy(logits.to(kGpu), targets.to(kGpu), -100);
        EXPECT_EQ(actual.count.item(), expected.count.item());
        // The loss is f32 (f64 for f64) whatever the logits' dtype.
        const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
        EXPECT_NEAR(actual.sum.item(), expected.sum.item(), tol * std::fabs(expected.sum.item()));
      }
    }
  }
}

TEST(GpuCrossEntropy, forward_is_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor logits = test::random_normal({128, 50304}, DType::bf16, kGpu, 2.0);
  const Tensor targets = targets_with_ignored(128, 50304, -1, DType::i64).to(kGpu);
  const kernels::LossSum first = kernels::cross_entropy(logits, targets, -1);
  for (int i = 0; i < 3; ++i) {
    const kernels::LossSum again = kernels::cross_entropy(logits, targets, -1);
    EXPECT_TRUE(test::all_equal(on_cpu(again.sum), on_cpu(first.sum)));
  }
}

TEST(GpuCrossEntropy, out_of_range_target_throws) {
  ACCRUE_REQUIRE_CUDA();
  ASSERT_TRUE(kernels::check_indices());
  const Tensor logits = test::random_normal({3, 5}, DType::f32, kGpu);
  EXPECT_THROW(
      kernels::cross_entropy(logits, from_vector<int64_t>({0, 5, 1}, {3}, DType::i64, kGpu), -100),
      Error);
  // ignore_index itself is fine even though it lies outside [0, C).
  const kernels::LossSum ok =
      kernels::cross_entropy(logits, from_vector<int64_t>({0, -100, 1}, {3}, DType::i64, kGpu));
  EXPECT_EQ(ok.count.item(), 2.0);
}

TEST(GpuCrossEntropy, backward_matches_cpu_and_zeroes_ignored_rows) {
  ACCRUE_REQUIRE_CUDA();
  struct Case {
    int64_t rows, classes;
  };
  const Case cases[] = {{64, 50304}, {300, 10}, {7, 3001}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(c.rows) + "x" +
                   std::to_string(c.classes));
      const Tensor logits = test::random_normal({c.rows, c.classes}, dt, kCpu, 3.0);
      const Tensor targets = targets_with_ignored(c.rows, c.classes, -100, DType::i64);
      // The seed is a 0-d tensor on the device (the loss scale): read in the kernel.
      const DType seed_dtype = dt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor seed = scalar_tensor(0.37, seed_dtype);
      const Tensor expected = kernels::cross_entropy_backward(logits, targets, -100, seed);
      const Tensor actual = on_cpu(
          kernels::cross_entropy_backward(logits.to(kGpu), targets.to(kGpu), -100, seed.to(kGpu)));
      EXPECT_TRUE(close(actual, expected, test::normalized_tolerance(dt)));
      // Ignored rows are exactly zero.
      const std::vector<int64_t> t = targets.to_vector<int64_t>();
      const std::vector<double> g = actual.to_vector<double>();
      for (int64_t r = 0; r < c.rows; ++r) {
        if (t[r] != -100) continue;
        for (int64_t k = 0; k < c.classes; ++k)
          ASSERT_EQ(g[r * c.classes + k], 0.0) << "row " << r << " class " << k;
      }
    }
  }
}

// ---- layer norm -----------------------------------------------------------------------

struct NormCase {
  int64_t rows, d;
  bool weight, bias;
};
// LayerNorm's backward kernels by case: the warp kernel (Note [LayerNorm warp
// backward]) takes rows of whole 16-byte packs, at most 4 a lane: d = 40, 96
// (1 a lane; 2 in f64), 768 in 16 bits (3), 1024 in 16 bits (4); 20000 and
// 8448 rows give it more than 4 kSpan blocks, so the column totals take their
// two levels (Note [Deterministic column sums]). The block-per-chunk kernel
// (Note [LayerNorm fused backward]) takes wider rows with at least 16 rows a
// chunk on up to 132 SMs: 8448 x 768 in f32 and f64. The rest take the dx and
// partials kernels.
const NormCase kNormCases[] = {
    {512, 768, true, true},   {37, 77, true, true},    {64, 1, true, true},
    {3, 4099, true, false},   {100, 768, false, true}, {19, 33, false, false},
    {20000, 40, true, true},  {8448, 768, true, true}, {8448, 96, false, true},
    {300, 1024, true, false},
};

std::string norm_name(DType dt, const NormCase& c) {
  return std::string(dtype_name(dt)) + " rows=" + std::to_string(c.rows) +
         " d=" + std::to_string(c.d) + (c.weight ? " w" : "") + (c.bias ? " b" : "");
}

TEST(GpuLayerNorm, forward_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (const NormCase& c : kNormCases) {
      SCOPED_TRACE(norm_name(dt, c));
      // An offset mean and a non-unit scale, so the statistics matter.
      const Tensor x = kernels::binary_scalar(
          kernels::BinaryOp::Add, test::random_normal({c.rows, c.d}, dt, kCpu, 2.0), 1.5);
      const Tensor w = c.weight ? test::random_normal({c.d}, dt) : Tensor();
      const Tensor b = c.bias ? test::random_normal({c.d}, dt) : Tensor();
      const kernels::LayerNormOutput e = kernels::layer_norm(x, w, b, 1e-5);
      const kernels::LayerNormOutput a =
          kernels::layer_norm(x.to(kGpu), c.weight ? w.to(kGpu) : w, c.bias ? b.to(kGpu) : b, 1e-5);
      EXPECT_TRUE(close(on_cpu(a.out), e.out, test::normalized_tolerance(dt)));
      const double stats_tol = dt == DType::f64 ? 1e-12 : 1e-5;
      EXPECT_TRUE(close(on_cpu(a.mean), e.mean, stats_tol));
      EXPECT_TRUE(close(on_cpu(a.rstd), e.rstd, stats_tol));
    }
  }
}

TEST(GpuLayerNorm, backward_matches_cpu_overwriting_and_accumulating) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (const NormCase& c : kNormCases) {
      // Parameter gradients in x's dtype and in fp32 (the arena).
      std::vector<DType> grad_dtypes = {dt};
      if (dt != DType::f32) grad_dtypes.push_back(DType::f32);
      for (DType gd : grad_dtypes) {
        SCOPED_TRACE(norm_name(dt, c) + " grads " + dtype_name(gd));
        const Tensor x = test::random_normal({c.rows, c.d}, dt, kCpu, 2.0);
        const Tensor w = c.weight ? test::random_normal({c.d}, dt) : Tensor();
        const Tensor dy = test::random_normal({c.rows, c.d}, dt);
        // The same statistics on both sides, from the CPU forward.
        const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, Tensor(), 1e-5);
        const Tensor x_g = x.to(kGpu), dy_g = dy.to(kGpu), w_g = c.weight ? w.to(kGpu) : w;
        const Tensor mean_g = fwd.mean.to(kGpu), rstd_g = fwd.rstd.to(kGpu);
        // Parameter-gradient tolerance: fp32 sums over rows, stored in gd.
        const double param_tol = gd == DType::f64   ? 1e-12
                                 : gd == DType::f32 ? 1e-5
                                                    : test::normalized_tolerance(gd);
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
          Tensor dw = test::random_normal({c.d}, gd), db = test::random_normal({c.d}, gd);
          if (!accumulate) {
            test::poison(dw);
            test::poison(db);
          }
          Tensor dw_g = dw.to(kGpu), db_g = db.to(kGpu);
          const Tensor dx =
              kernels::layer_norm_backward(dy, x, w, fwd.mean, fwd.rstd, dw, db, accumulate);
          const Tensor dx_g =
              kernels::layer_norm_backward(dy_g, x_g, w_g, mean_g, rstd_g, dw_g, db_g, accumulate);
          if (c.d == 1) {
            // One feature normalizes to 0 whatever x is, so dx is 0 in exact
            // arithmetic and both sides hold only rounding noise: a relative
            // comparison of two noises is meaningless; bound them instead.
            for (const Tensor& t : {on_cpu(dx_g), dx}) {
              for (double v : t.to(DType::f64).to_vector<double>()) {
                EXPECT_LE(std::abs(v), 1e-3) << "d=1 dx should be ~0";
              }
            }
          } else {
            EXPECT_TRUE(close(on_cpu(dx_g), dx, test::normalized_tolerance(dt)));
          }
          EXPECT_TRUE(close(on_cpu(dw_g), dw, param_tol));
          EXPECT_TRUE(close(on_cpu(db_g), db, param_tol));
        }
      }
    }
  }
}

// dx_add (Note [Fan-out sums in the backward]) on every path of the CUDA
// backward, against the CPU's: the warp kernel (768 in bf16, 100 in f32), the
// block kernel (1,600 wide over 8,448 rows: 16 rows a chunk), the
// one-block-per-row kernel (768 in f32 over 64 rows, 100 in bf16: no whole
// number of packs) and an unaligned dx_add (that kernel too).
TEST(GpuLayerNorm, backward_adds_dx_add_on_every_path) {
  ACCRUE_REQUIRE_CUDA();
  struct Case {
    int64_t rows, d;
    bool unaligned_add;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : {Case{64, 768, false}, Case{8448, 1600, false}, Case{33, 100, false},
                          Case{64, 768, true}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(c.rows) + "x" +
                   std::to_string(c.d) + (c.unaligned_add ? " unaligned" : ""));
      const Tensor x = test::random_normal({c.rows, c.d}, dt, kCpu, 2.0);
      const Tensor w = test::random_normal({c.d}, dt);
      const Tensor dy = test::random_normal({c.rows, c.d}, dt);
      // dx_add one element into a larger buffer when unaligned (a view: the
      // kernels see its data as is).
      const int64_t n = c.rows * c.d, shift = c.unaligned_add ? 1 : 0;
      const Tensor add_buffer = test::random_normal({n + 1}, dt);
      const Tensor add = add_buffer.narrow(0, shift, n).reshape({c.rows, c.d});
      const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, Tensor(), 1e-5);
      kernels::NormPartials p, p_g;
      const Tensor dx =
          kernels::layer_norm_backward_partials(dy, x, w, fwd.mean, fwd.rstd, true, true, &p, add);
      const Tensor add_g = add_buffer.to(kGpu).narrow(0, shift, n).reshape({c.rows, c.d});
      const Tensor dx_g = kernels::layer_norm_backward_partials(
          dy.to(kGpu), x.to(kGpu), w.to(kGpu), fwd.mean.to(kGpu), fwd.rstd.to(kGpu), true, true,
          &p_g, add_g);
      EXPECT_TRUE(close(on_cpu(dx_g), dx, test::normalized_tolerance(dt)));
      Tensor dw = empty({c.d}), db = empty({c.d}), dw_g = empty({c.d}, DType::f32, kGpu),
             db_g = empty({c.d}, DType::f32, kGpu);
      kernels::norm_param_totals(p, dw, db, false);
      kernels::norm_param_totals(p_g, dw_g, db_g, false);
      EXPECT_TRUE(close(on_cpu(dw_g), dw, 1e-5));
      EXPECT_TRUE(close(on_cpu(db_g), db, 1e-5));
    }
  }
}

TEST(GpuLayerNorm, backward_without_parameter_grads_and_with_one) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({50, 96});
  const Tensor w = test::random_normal({96});
  const Tensor dy = test::random_normal({50, 96});
  const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, Tensor(), 1e-5);
  const Tensor dx =
      kernels::layer_norm_backward(dy, x, w, fwd.mean, fwd.rstd, Tensor(), Tensor(), false);
  const Tensor x_g = x.to(kGpu), dy_g = dy.to(kGpu), w_g = w.to(kGpu);
  const Tensor mean_g = fwd.mean.to(kGpu), rstd_g = fwd.rstd.to(kGpu);
  EXPECT_TRUE(close(on_cpu(kernels::layer_norm_backward(dy_g, x_g, w_g, mean_g, rstd_g, Tensor(),
                                                        Tensor(), false)),
                    dx, 1e-5));
  // Only dbias.
  Tensor db = empty({96});
  kernels::layer_norm_backward(dy, x, w, fwd.mean, fwd.rstd, Tensor(), db, false);
  Tensor db_g = empty({96}, DType::f32, kGpu);
  test::poison(db_g);
  kernels::layer_norm_backward(dy_g, x_g, w_g, mean_g, rstd_g, Tensor(), db_g, false);
  EXPECT_TRUE(close(on_cpu(db_g), db, 1e-5));
}

TEST(GpuLayerNorm, backward_is_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t rows = 8192, d = 768;
  const Tensor x = test::random_normal({rows, d}, DType::bf16, kGpu);
  const Tensor w = test::random_normal({d}, DType::bf16, kGpu);
  const Tensor dy = test::random_normal({rows, d}, DType::bf16, kGpu);
  const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, Tensor(), 1e-5);
  auto run = [&](Tensor& dw, Tensor& db) {
    dw = empty({d}, DType::f32, kGpu);
    db = empty({d}, DType::f32, kGpu);
    return on_cpu(kernels::layer_norm_backward(dy, x, w, fwd.mean, fwd.rstd, dw, db, false));
  };
  Tensor dw1, db1, dw2, db2;
  const Tensor dx1 = run(dw1, db1);
  const Tensor dx2 = run(dw2, db2);
  EXPECT_TRUE(test::all_equal(dx2, dx1));
  EXPECT_TRUE(test::all_equal(on_cpu(dw2), on_cpu(dw1)));
  EXPECT_TRUE(test::all_equal(on_cpu(db2), on_cpu(db1)));
}

// The two halves the weight-gradient branch runs apart (Note [Weight gradients
// on a branch]), the totals on a second stream after an event: the bits of the
// whole backward, for the warp kernel's rows (1,024 x 768), the fused kernel's
// (8,192 x 768) and the generic path (a width of 100), writing and adding.
TEST(GpuLayerNorm, backward_in_two_halves_on_two_streams_equals_the_whole) {
  ACCRUE_REQUIRE_CUDA();
  Stream side(0);
  Event ready;
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{1024, 768}, {8192, 768}, {50, 100}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(d));
    const Tensor x = test::random_normal({rows, d}, DType::bf16, kGpu, 2.0);
    const Tensor w = test::random_normal({d}, DType::bf16, kGpu);
    const Tensor dy = test::random_normal({rows, d}, DType::bf16, kGpu);
    const kernels::LayerNormOutput fwd = kernels::layer_norm(x, w, Tensor(), 1e-5);
    for (bool accumulate : {false, true}) {
      Tensor dw = test::random_normal({d}, DType::f32, kGpu);
      Tensor db = test::random_normal({d}, DType::f32, kGpu);
      Tensor dw2 = dw.clone(), db2 = db.clone();
      const Tensor dx =
          kernels::layer_norm_backward(dy, x, w, fwd.mean, fwd.rstd, dw, db, accumulate);
      kernels::NormPartials p;
      const Tensor dx2 =
          kernels::layer_norm_backward_partials(dy, x, w, fwd.mean, fwd.rstd, true, true, &p);
      ready.record(current_stream(0));
      ready.block(side.handle());
      {
        const StreamGuard on(0, side.handle());
        kernels::norm_param_totals(p, dw2, db2, accumulate);
        ready.record(side.handle());
      }
      ready.block(current_stream(0));
      EXPECT_TRUE(test::all_equal(on_cpu(dx2), on_cpu(dx)));
      EXPECT_TRUE(test::all_equal(on_cpu(dw2), on_cpu(dw)));
      EXPECT_TRUE(test::all_equal(on_cpu(db2), on_cpu(db)));
    }
  }
}

// Note [Composed convolution]: conv2d and both gradients on CUDA against the
// CPU reference on fresh random inputs: f32 (TF32 off) to 1e-5, bf16 to 2e-2
// (relative L2), over stride, padding, dilation and groups; the weight
// gradient straight into an fp32 slot with beta 0 (NaN there stays out) and 1.
TEST(GpuConv, conv2d_and_its_gradients_match_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  const bool tf32 = kernels::allow_tf32();
  kernels::set_allow_tf32(false);
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  Conv2dOptions strided, grouped, dilated;
  strided.stride_h = strided.stride_w = 2;
  strided.pad_h = 1;
  strided.pad_w = 2;
  grouped.groups = 2;
  grouped.pad_h = grouped.pad_w = 1;
  dilated.dilation_h = dilated.dilation_w = 2;
  dilated.pad_h = dilated.pad_w = 2;
  const Case cases[] = {{{2, 3, 9, 8}, {5, 3, 3, 2}, strided},
                        {{2, 4, 6, 5}, {6, 2, 3, 3}, grouped},
                        {{1, 8, 12, 12}, {16, 8, 3, 3}, dilated}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 2e-2;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + shape_str(c.x));
      const Tensor x = test::random_normal(c.x, dtype, kGpu);
      const Tensor w = test::random_normal(c.w, dtype, kGpu);
      const Tensor y = kernels::conv2d(x, w, c.o);
      const Tensor y_ref = kernels::conv2d(on_cpu(x), on_cpu(w), c.o);
      EXPECT_LE(test::relative_error(on_cpu(y).to(DType::f64), y_ref.to(DType::f64)), tol);
      const Tensor dy = test::random_normal(y.shape(), dtype, kGpu);
      EXPECT_LE(test::relative_error(
                    on_cpu(kernels::conv2d_backward_input(dy, w, c.x, c.o)).to(DType::f64),
                    kernels::conv2d_backward_input(on_cpu(dy), on_cpu(w), c.x, c.o).to(DType::f64)),
                tol);
      const Tensor dw_ref = empty(c.w, DType::f64);
      kernels::conv2d_backward_weight(on_cpu(dy).to(DType::f64), on_cpu(x).to(DType::f64), dw_ref,
                                      c.o, 0.0);
      // Note [Parameter layouts]: a row-major slot, and a channels-last one.
      for (bool channels_last_slot : {false, true}) {
        SCOPED_TRACE(channels_last_slot ? "channels-last slot" : "row-major slot");
        const Tensor nan = full(c.w, std::numeric_limits<double>::quiet_NaN(), DType::f32, kGpu);
        Tensor slot = channels_last_slot ? test::as_channels_last(nan) : nan;
        kernels::conv2d_backward_weight(dy, x, slot, c.o, 0.0);
        EXPECT_LE(test::relative_error(on_cpu(slot).to(DType::f64), dw_ref), tol);
        kernels::conv2d_backward_weight(dy, x, slot, c.o, 1.0);
        EXPECT_LE(test::relative_error(on_cpu(slot).to(DType::f64),
                                       kernels::binary_scalar(kernels::BinaryOp::Mul, dw_ref, 2.0)),
                  tol);
      }
    }
  }
  kernels::set_allow_tf32(tf32);
}

// Note [cuDNN convolution]: bf16 convolutions of a ResNet's shapes, NCHW and
// channels-last (NHWC-packed views) activations, each with row-major and
// channels-last weights (Note [Parameter layouts]: the weight gradient's slot
// laid out as the weight), forward and both gradients against the CPU
// reference; a channels-last input gives a channels-last output on the cuDNN
// path; the weight gradient lands in an fp32 slot with beta 0 and 1 and, with
// only deterministic engines, is bitwise the same on a second run.
void check_cudnn_convolutions(bool deterministic) {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  Conv2dOptions same, stem, down;
  same.pad_h = same.pad_w = 1;
  stem.stride_h = stem.stride_w = 2;
  stem.pad_h = stem.pad_w = 3;
  down.stride_h = down.stride_w = 2;
  const Case cases[] = {{{4, 64, 14, 14}, {64, 64, 3, 3}, same},
                        {{2, 8, 32, 32}, {64, 8, 7, 7}, stem},
                        {{4, 64, 14, 14}, {128, 64, 1, 1}, down}};
  const double tol = 2e-2;
  // [N, C, H, W] viewed over a channels-last buffer holding t's values.
  for (const Case& c : cases) {
    for (int layouts = 0; layouts < 4; ++layouts) {
      const bool nhwc = layouts & 1, weights_last = layouts & 2;
      SCOPED_TRACE(shape_str(c.x) + (nhwc ? " channels-last" : " NCHW") +
                   (weights_last ? ", channels-last weights" : ", row-major weights"));
      const Tensor x_nchw = test::random_normal(c.x, DType::bf16, kGpu);
      const Tensor w_nchw = test::random_normal(c.w, DType::bf16, kGpu);
      const Tensor x = nhwc ? test::as_channels_last(x_nchw) : x_nchw;
      const Tensor w = weights_last ? test::as_channels_last(w_nchw) : w_nchw;
      const Tensor y = kernels::conv2d(x, w, c.o);
      if (nhwc && kernels::cudnn_convolution_available()) {
        EXPECT_FALSE(y.is_contiguous()) << "cuDNN keeps a channels-last input's layout";
        EXPECT_EQ(y.stride(1), 1);
      }
      const Tensor x64 = on_cpu(x_nchw).to(DType::f64), w64 = on_cpu(w_nchw).to(DType::f64);
      EXPECT_LE(test::relative_error(on_cpu(y.contiguous()).to(DType::f64),
                                     kernels::conv2d(x64, w64, c.o)),
                tol);
      const Tensor dy_nchw = test::random_normal(y.shape(), DType::bf16, kGpu);
      const Tensor dy = nhwc ? test::as_channels_last(dy_nchw) : dy_nchw;
      const Tensor dy64 = on_cpu(dy_nchw).to(DType::f64);
      EXPECT_LE(
          test::relative_error(
              on_cpu(kernels::conv2d_backward_input(dy, w, c.x, c.o).contiguous()).to(DType::f64),
              kernels::conv2d_backward_input(dy64, w64, c.x, c.o)),
          tol);
      const Tensor dw_ref = empty(c.w, DType::f64);
      kernels::conv2d_backward_weight(dy64, x64, dw_ref, c.o, 0.0);
      const Tensor nan = full(c.w, std::numeric_limits<double>::quiet_NaN(), DType::f32, kGpu);
      Tensor slot = weights_last ? test::as_channels_last(nan) : nan;
      kernels::conv2d_backward_weight(dy, x, slot, c.o, 0.0);
      const Tensor first = on_cpu(slot);
      EXPECT_LE(test::relative_error(first.to(DType::f64), dw_ref), tol);
      kernels::conv2d_backward_weight(dy, x, slot, c.o, 0.0);
      if (deterministic) {
        EXPECT_TRUE(test::all_equal(on_cpu(slot), first)) << "a second run differs";
      }
      kernels::conv2d_backward_weight(dy, x, slot, c.o, 1.0);
      EXPECT_LE(test::relative_error(on_cpu(slot).to(DType::f64),
                                     kernels::binary_scalar(kernels::BinaryOp::Mul, dw_ref, 2.0)),
                tol);
    }
  }
}

TEST(GpuConv, cudnn_convolutions_in_both_layouts_match_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  check_cudnn_convolutions(/*deterministic=*/true);
}

// The other engine policies (kernels::ConvAlgorithmPolicy) build their own
// graphs: every candidate timed, the non-deterministic engines admitted, and
// the weight gradient computed in bf16 before it is added into the slot.
TEST(GpuConv, cudnn_convolutions_match_the_cpu_reference_under_every_engine_policy) {
  ACCRUE_REQUIRE_CUDA();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    kernels::ConvAlgorithmPolicy policy;
    policy.timed = variant < 2;
    policy.allow_nondeterministic = variant == 1;
    policy.weight_gradient_in_operand_dtype = variant == 2;
    kernels::set_conv_algorithm_policy(policy);
    check_cudnn_convolutions(!policy.allow_nondeterministic);
  }
  kernels::set_conv_algorithm_policy({});
  EXPECT_FALSE(kernels::conv_algorithm_policy().timed);
}

// Note [Pointwise convolution as a GEMM] on CUDA: bf16 1 x 1 convolutions of
// channels-last activations, through kernels::conv2d and its gradients, match
// the CPU reference, stay channels-last, and agree with the cuDNN path (the
// switch off) within bf16 rounding.
TEST(GpuConv, pointwise_convolutions_as_gemms_match_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  const Conv2dOptions o;
  const Shape xs = {8, 256, 14, 14}, ws = {64, 256, 1, 1};
  const Tensor x_nchw = test::random_normal(xs, DType::bf16, kGpu);
  const Tensor w = test::random_normal(ws, DType::bf16, kGpu, 0.1);
  const Tensor x = test::as_channels_last(x_nchw);
  const Tensor x64 = on_cpu(x_nchw).to(DType::f64), w64 = on_cpu(w).to(DType::f64);
  ASSERT_TRUE(kernels::pointwise_conv_gemm());
  const Tensor y = kernels::conv2d(x, w, o);
  EXPECT_EQ(y.stride(1), 1);
  const Tensor y64 = kernels::conv2d(x64, w64, o);
  EXPECT_LE(test::relative_error(on_cpu(y.contiguous()).to(DType::f64), y64), 1e-2);
  const Tensor dy_nchw = test::random_normal(y.shape(), DType::bf16, kGpu);
  const Tensor dy = test::as_channels_last(dy_nchw), dy64 = on_cpu(dy_nchw).to(DType::f64);
  const Tensor dx = kernels::conv2d_backward_input(dy, w, xs, o);
  EXPECT_EQ(dx.stride(1), 1);
  EXPECT_LE(test::relative_error(on_cpu(dx.contiguous()).to(DType::f64),
                                 kernels::conv2d_backward_input(dy64, w64, xs, o)),
            1e-2);
  const Tensor dw64 = empty(ws, DType::f64);
  kernels::conv2d_backward_weight(dy64, x64, dw64, o, 0.0);
  Tensor slot = full(ws, std::numeric_limits<double>::quiet_NaN(), DType::f32, kGpu);
  kernels::conv2d_backward_weight(dy, x, slot, o, 0.0);
  EXPECT_LE(test::relative_error(on_cpu(slot).to(DType::f64), dw64), 1e-2);
  kernels::conv2d_backward_weight(dy, x, slot, o, 1.0);
  EXPECT_LE(test::relative_error(on_cpu(slot).to(DType::f64),
                                 kernels::binary_scalar(kernels::BinaryOp::Mul, dw64, 2.0)),
            1e-2);
  // The same convolution with the switch off (cuDNN, or composed without it).
  kernels::set_pointwise_conv_gemm(false);
  const Tensor y_other = kernels::conv2d(x, w, o);
  kernels::set_pointwise_conv_gemm(true);
  EXPECT_LE(test::relative_error(on_cpu(y_other.contiguous()).to(DType::f64),
                                 on_cpu(y.contiguous()).to(DType::f64)),
            1e-2);
}

// Note [Per-shape convolution paths], the weight gradient: a 1 x 1 bf16 convolution over a
// channels-last activation offers three paths (the GEMM on views, cuDNN's
// fp32 output, cuDNN's bf16 output copied into the slot). The first call
// times them and records one line in the tuning file, whose choice computes
// bitwise what that path's fixed policy computes; the next call reads the
// line (nothing appended); a file naming each of the other choices is obeyed.
// The fixed results run with the same file, so the GEMM path's own algorithm
// is the recorded one too.
TEST(GpuConv, per_shape_weight_gradient_records_its_choice_and_reproduces_a_fixed_path) {
  ACCRUE_REQUIRE_CUDA();
  if (!kernels::cudnn_convolution_available()) GTEST_SKIP() << "built without the cuDNN frontend";
  const auto dir = std::filesystem::temp_directory_path();
  const std::string file = (dir / "accrue_conv_per_shape.txt").string();
  std::remove(file.c_str());
  kernels::set_gemm_tuning_file(file);
  const Conv2dOptions o;
  // Sizes no other test uses, so this shape's choice is made here.
  const Shape xs = {6, 192, 10, 10}, ws = {96, 192, 1, 1};
  const Tensor x = test::as_channels_last(test::random_normal(xs, DType::bf16, kGpu));
  const Tensor dy = test::as_channels_last(test::random_normal({6, 96, 10, 10}, DType::bf16, kGpu));
  auto weight_gradient = [&](double beta, const Tensor& start) {
    Tensor slot = start.to(kGpu);
    kernels::conv2d_backward_weight(dy, x, slot, o, beta);
    return on_cpu(slot);
  };
  const Tensor nan = full(ws, std::numeric_limits<double>::quiet_NaN(), DType::f32);
  // The paths in the order the choice counts them, each under its fixed policy.
  std::vector<Tensor> fixed;
  for (int path = 0; path < 3; ++path) {
    kernels::set_pointwise_conv_gemm(path == 0);
    kernels::ConvAlgorithmPolicy policy;
    policy.weight_gradient_in_operand_dtype = path == 2;
    kernels::set_conv_algorithm_policy(policy);
    fixed.push_back(weight_gradient(0.0, nan));
  }
  kernels::set_pointwise_conv_gemm(true);
  kernels::ConvAlgorithmPolicy per_shape;
  per_shape.path_per_shape = true;
  kernels::set_conv_algorithm_policy(per_shape);
  const Tensor chosen = weight_gradient(0.0, nan);
  auto conv_lines = [](const std::string& path) {
    std::vector<std::string> lines;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("conv2d_backward_weight,", 0) == 0) lines.push_back(line);
    return lines;
  };
  std::vector<std::string> lines = conv_lines(file);
  ASSERT_EQ(lines.size(), 1u) << "one shape, one recorded choice";
  const std::string prefix = lines[0].substr(0, lines[0].rfind(',') + 1);
  const int choice = std::stoi(lines[0].substr(prefix.size()));
  ASSERT_TRUE(choice >= 0 && choice < 3) << lines[0];
  EXPECT_NE(prefix.find(",paths012,"), std::string::npos) << prefix;
  EXPECT_TRUE(test::all_equal(chosen, fixed[static_cast<size_t>(choice)])) << "choice " << choice;
  EXPECT_TRUE(test::all_equal(weight_gradient(0.0, nan), chosen)) << "the second call";
  EXPECT_EQ(conv_lines(file).size(), 1u) << "the second call read the line";
  // beta 1 is a problem of its own (a temporary then added, or the GEMM's beta).
  const Tensor dw64 = empty(ws, DType::f64);
  kernels::conv2d_backward_weight(on_cpu(dy).to(DType::f64), on_cpu(x).to(DType::f64), dw64, o,
                                  0.0);
  EXPECT_LE(test::relative_error(weight_gradient(1.0, chosen).to(DType::f64),
                                 kernels::binary_scalar(kernels::BinaryOp::Mul, dw64, 2.0)),
            1e-2);
  EXPECT_EQ(conv_lines(file).size(), 2u) << "beta 1 recorded its own choice";
  // A file naming another path: the GEMM lines copied, the convolution's choice replaced.
  for (int forced = 0; forced < 3; ++forced) {
    SCOPED_TRACE("forced " + std::to_string(forced));
    const std::string other =
        (dir / ("accrue_conv_forced_" + std::to_string(forced) + ".txt")).string();
    {
      std::ifstream in(file);
      std::ofstream out(other);
      for (std::string line; std::getline(in, line);)
        out << (line.rfind(prefix, 0) == 0 ? prefix + std::to_string(forced) : line) << "\n";
    }
    kernels::set_gemm_tuning_file(other);
    EXPECT_TRUE(test::all_equal(weight_gradient(0.0, nan), fixed[static_cast<size_t>(forced)]));
    std::remove(other.c_str());
  }
  kernels::set_gemm_tuning_file("");
  kernels::set_conv_algorithm_policy({});
  std::remove(file.c_str());
}

// Note [Per-shape convolution paths], the forward and the data gradient: a
// 1 x 1 bf16 convolution over a channels-last activation runs as the GEMM on
// views or on cuDNN. Each direction records one line, and its result is
// bitwise that of the fixed setting it chose (the switch on: the GEMM; off:
// cuDNN); a file naming the other path is obeyed.
TEST(GpuConv, per_shape_forward_and_data_gradient_record_their_choices) {
  ACCRUE_REQUIRE_CUDA();
  if (!kernels::cudnn_convolution_available()) GTEST_SKIP() << "built without the cuDNN frontend";
  const auto dir = std::filesystem::temp_directory_path();
  const std::string file = (dir / "accrue_conv_per_shape_fwd.txt").string();
  std::remove(file.c_str());
  kernels::set_gemm_tuning_file(file);
  const Conv2dOptions o;
  // Sizes no other test uses.
  const Shape xs = {6, 160, 12, 12}, ws = {80, 160, 1, 1};
  const Tensor x = test::as_channels_last(test::random_normal(xs, DType::bf16, kGpu));
  const Tensor w = test::random_normal(ws, DType::bf16, kGpu, 0.1);
  const Tensor dy = test::as_channels_last(test::random_normal({6, 80, 12, 12}, DType::bf16, kGpu));
  auto both = [&] {
    return std::make_pair(on_cpu(kernels::conv2d(x, w, o).contiguous()),
                          on_cpu(kernels::conv2d_backward_input(dy, w, xs, o).contiguous()));
  };
  std::vector<std::pair<Tensor, Tensor>> fixed;
  for (int path = 0; path < 2; ++path) {
    kernels::set_pointwise_conv_gemm(path == 0);
    fixed.push_back(both());
  }
  kernels::set_pointwise_conv_gemm(true);
  kernels::ConvAlgorithmPolicy per_shape;
  per_shape.path_per_shape = true;
  kernels::set_conv_algorithm_policy(per_shape);
  const auto chosen = both();
  auto choices = [](const std::string& path) {
    std::map<std::string, int> found;  // "conv2d," / "conv2d_backward_input," line prefix -> choice
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("conv2d,", 0) == 0 || line.rfind("conv2d_backward_input,", 0) == 0)
        found[line.substr(0, line.rfind(',') + 1)] = std::stoi(line.substr(line.rfind(',') + 1));
    return found;
  };
  const std::map<std::string, int> recorded = choices(file);
  ASSERT_EQ(recorded.size(), 2u) << "one line per direction";
  for (const auto& [prefix, choice] : recorded) {
    SCOPED_TRACE(prefix);
    ASSERT_TRUE(choice == 0 || choice == 1);
    const bool forward = prefix.rfind("conv2d,", 0) == 0;
    const Tensor& got = forward ? chosen.first : chosen.second;
    const Tensor& want = forward ? fixed[static_cast<size_t>(choice)].first
                                 : fixed[static_cast<size_t>(choice)].second;
    EXPECT_TRUE(test::all_equal(got, want));
  }
  // Both directions forced to the path not chosen.
  const std::string other = (dir / "accrue_conv_per_shape_fwd_forced.txt").string();
  {
    std::ifstream in(file);
    std::ofstream out(other);
    for (std::string line; std::getline(in, line);) {
      const std::string prefix = line.substr(0, line.rfind(',') + 1);
      auto it = recorded.find(prefix);
      out << (it == recorded.end() ? line : prefix + std::to_string(1 - it->second)) << "\n";
    }
  }
  kernels::set_gemm_tuning_file(other);
  const auto forced = both();
  for (const auto& [prefix, choice] : recorded) {
    const bool forward = prefix.rfind("conv2d,", 0) == 0;
    const auto& want = fixed[static_cast<size_t>(1 - choice)];
    EXPECT_TRUE(
        test::all_equal(forward ? forced.first : forced.second, forward ? want.first : want.second))
        << prefix;
  }
  kernels::set_gemm_tuning_file("");
  kernels::set_conv_algorithm_policy({});
  std::remove(file.c_str());
  std::remove(other.c_str());
}

// Note [Composed convolution]: adaptive average pooling on CUDA against the
// CPU reference, forward and backward, f32 and bf16, including overlapping cells.
TEST(GpuConv, adaptive_average_pooling_matches_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
    for (const auto& [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 2}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " to " + std::to_string(oh) + "x" +
                   std::to_string(ow));
      const Tensor x = test::random_normal({2, 5, 7, 5}, dtype, kGpu);
      const Tensor y = kernels::adaptive_avg_pool2d(x, oh, ow);
      EXPECT_LE(
          test::relative_error(on_cpu(y).to(DType::f64),
                               kernels::adaptive_avg_pool2d(on_cpu(x), oh, ow).to(DType::f64)),
          tol);
      const Tensor dy = test::random_normal(y.shape(), dtype, kGpu);
      EXPECT_LE(test::relative_error(
                    on_cpu(kernels::adaptive_avg_pool2d_backward(dy, x.shape())).to(DType::f64),
                    kernels::adaptive_avg_pool2d_backward(on_cpu(dy), x.shape()).to(DType::f64)),
                tol);
    }
  }
}

// Note [Max pooling kernels]: the CUDA kernels against the CPU reference on
// fresh small integers, so ties are common (the first maximum must win) and
// every sum is exact: values, indices and the gathered gradient compare bit
// for bit, for every float dtype, contiguous, channels-last and a strided
// view, over window, stride and padding; a NaN wins its windows; a second
// run gives the same bits; the output keeps the input's layout.
TEST(GpuConv, max_pooling_kernels_match_the_cpu_reference_exactly) {
  ACCRUE_REQUIRE_CUDA();
  struct Case {
    Shape x;
    int kh, kw, sh, sw, ph, pw;
  };
  const Case cases[] = {
      {{3, 16, 23, 20}, 3, 3, 2, 2, 1, 1},  // ResNet's stem
      {{2, 8, 12, 12}, 2, 2, 2, 2, 0, 0},
      {{2, 5, 11, 13}, 3, 2, 1, 2, 1, 1},  // odd channels, a wide window
      {{1, 3, 9, 9}, 3, 3, 3, 3, 1, 0},
  };
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      Pool2dOptions p;
      p.kernel_h = c.kh;
      p.kernel_w = c.kw;
      p.stride_h = c.sh;
      p.stride_w = c.sw;
      p.pad_h = c.ph;
      p.pad_w = c.pw;
      const Tensor x_cpu = test::random_integers(c.x, -4, 4, dt);
      const kernels::MaxPoolOutput ref = kernels::max_pool2d(x_cpu, p);
      const Tensor dy_cpu = test::random_integers(ref.out.shape(), -8, 8, dt);
      const Tensor dx_ref = kernels::max_pool2d_backward(dy_cpu, ref.indices, c.x, p);
      for (int layout = 0; layout < 3; ++layout) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.x) + " layout " +
                     std::to_string(layout));
        Tensor x = x_cpu.to(kGpu), dy = dy_cpu.to(kGpu);
        if (layout == 1) {
          x = test::as_channels_last(x);
          dy = test::as_channels_last(dy);
        } else if (layout == 2) {  // every operand a strided view of a larger buffer
          x = test::random_normal({c.x[0], c.x[1], c.x[2], 2 * c.x[3]}, dt, kGpu)
                  .narrow(3, 1, c.x[3]);
          x.copy_(x_cpu.to(kGpu));
          dy = dy.permute({0, 1, 3, 2}).contiguous().permute({0, 1, 3, 2});
        }
        const kernels::MaxPoolOutput got = kernels::max_pool2d(x, p);
        if (layout == 1) {
          EXPECT_EQ(got.out.stride(1), 1) << "channels-last stays so";
        }
        EXPECT_TRUE(test::all_equal(on_cpu(got.out), ref.out));
        EXPECT_EQ(on_cpu(got.indices).to_vector<int64_t>(), ref.indices.to_vector<int64_t>());
        const Tensor dx = kernels::max_pool2d_backward(dy, got.indices, c.x, p);
        EXPECT_TRUE(test::all_equal(on_cpu(dx), dx_ref));
        EXPECT_TRUE(test::all_equal(on_cpu(kernels::max_pool2d_backward(dy, got.indices, c.x, p)),
                                    on_cpu(dx)));
      }
    }
  }
  // A NaN wins every window that holds it, as on the CPU.
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 1;
  Tensor xn = test::random_normal({1, 2, 4, 4}, DType::f32);
  Tensor(xn).narrow(2, 1, 1).narrow(3, 2, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  const kernels::MaxPoolOutput rn = kernels::max_pool2d(xn, p);
  const kernels::MaxPoolOutput gn = kernels::max_pool2d(xn.to(kGpu), p);
  EXPECT_EQ(on_cpu(gn.indices).to_vector<int64_t>(), rn.indices.to_vector<int64_t>());
  const std::vector<float> got_values = on_cpu(gn.out).to_vector<float>();
  const std::vector<float> ref_values = rn.out.to_vector<float>();
  for (size_t i = 0; i < ref_values.size(); ++i)
    EXPECT_EQ(std::isnan(got_values[i]), std::isnan(ref_values[i])) << i;
}

TEST(GpuConv, max_pooling_backward_refuses_indices_outside_the_plane) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor dy = test::random_normal({1, 2, 2, 2}, DType::f32, kGpu);
  Tensor idx = test::random_integers({1, 2, 2, 2}, 0, 15, DType::i64).to(kGpu);
  Tensor(idx).narrow(1, 1, 1).narrow(2, 1, 1).narrow(3, 0, 1).fill_(16.0);
  Pool2dOptions p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  EXPECT_ERROR(kernels::max_pool2d_backward(dy, idx, {1, 2, 4, 4}, p), "max_pool2d_backward", "16");
}

// Note [Composed convolution]: average pooling on CUDA against the CPU
// reference, with and without the padding counted, and a device mismatch is an error.
TEST(GpuConv, average_pooling_matches_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  for (bool include_pad : {true, false}) {
    Pool2dOptions p;
    p.kernel_h = p.kernel_w = 3;
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    p.count_include_pad = include_pad;
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (include_pad ? " pad counted" : ""));
      const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
      const Tensor x = test::random_normal({2, 3, 9, 8}, dtype, kGpu);
      const Tensor y = kernels::avg_pool2d(x, p);
      EXPECT_LE(test::relative_error(on_cpu(y).to(DType::f64),
                                     kernels::avg_pool2d(on_cpu(x), p).to(DType::f64)),
                tol);
      const Tensor dy = test::random_normal(y.shape(), dtype, kGpu);
      EXPECT_LE(test::relative_error(
                    on_cpu(kernels::avg_pool2d_backward(dy, x.shape(), p)).to(DType::f64),
                    kernels::avg_pool2d_backward(on_cpu(dy), x.shape(), p).to(DType::f64)),
                tol);
    }
  }
  const Tensor x = test::random_normal({1, 2, 5, 5}, DType::f32, kGpu);
  const Tensor w = test::random_normal({3, 2, 3, 3}, DType::f32);  // on the CPU
  EXPECT_ERROR(kernels::conv2d(x, w, {}), "conv2d", "weight", "cpu", "the input on cuda:0");
}

// ---- batch norm ------------------------------------------------------------------------

// Note [Fused batch norm kernels]: the CUDA kernels against the CPU reference,
// every float dtype, contiguous and channels-last (both reduction kernels:
// inner > 1 and inner == 1), channels far from zero, bitwise repeatable.
TEST(GpuBatchNorm, fused_kernels_match_the_cpu_reference_in_both_layouts) {
  ACCRUE_REQUIRE_CUDA();
  const Shape shapes[] = {{16, 64, 14, 14}, {3, 5, 9, 7}, {64, 256, 7, 7}, {300, 40}, {4, 48, 33}};
  for (DType dt : kFloatTypes) {
    for (const Shape& shape : shapes) {
      for (bool last : {false, true}) {
        if (last && shape.size() != 4) continue;
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) +
                     (last ? " channels-last" : ""));
        const int64_t c = shape[1];
        // Channel means spread over [-50, 50): a plain sum of squares would cancel.
        const Tensor offsets = test::random_uniform({1, c, 1, 1}, -50.0, 50.0, DType::f64)
                                   .reshape(shape.size() == 4   ? Shape{1, c, 1, 1}
                                            : shape.size() == 3 ? Shape{1, c, 1}
                                                                : Shape{1, c});
        const Tensor x_cpu =
            kernels::binary(kernels::BinaryOp::Add,
                            test::random_normal(shape, DType::f64, kCpu, 2.0), offsets)
                .to(dt);
        const Tensor w = test::random_normal({c}, dt), b = test::random_normal({c}, dt);
        const Tensor g_cpu = test::random_normal(shape, dt);
        const kernels::BatchNormForward ef = kernels::batch_norm_forward(x_cpu, w, b, 1e-5);
        const kernels::BatchNormBackward eb =
            kernels::batch_norm_backward(g_cpu, x_cpu, w, ef.mean, ef.invstd, true);

        const Tensor x = last ? test::as_channels_last(x_cpu.to(kGpu)) : x_cpu.to(kGpu);
        const Tensor g = last ? test::as_channels_last(g_cpu.to(kGpu)) : g_cpu.to(kGpu);
        const kernels::BatchNormForward af =
            kernels::batch_norm_forward(x, w.to(kGpu), b.to(kGpu), 1e-5);
        EXPECT_EQ(af.out.strides(), x.strides()) << "the output keeps the input's layout";
        const double tol = test::normalized_tolerance(dt);
        const double stats_tol = dt == DType::f64 ? 1e-12 : 1e-5;
        EXPECT_TRUE(close(on_cpu(af.out), ef.out, tol));
        EXPECT_TRUE(close(on_cpu(af.mean), ef.mean, stats_tol));
        EXPECT_TRUE(close(on_cpu(af.var), ef.var, dt == DType::f64 ? 1e-12 : 1e-4));
        EXPECT_TRUE(close(on_cpu(af.invstd), ef.invstd, dt == DType::f64 ? 1e-12 : 1e-4));
        const kernels::BatchNormBackward ab =
            kernels::batch_norm_backward(g, x, w.to(kGpu), af.mean, af.invstd, true);
        EXPECT_EQ(ab.dx.strides(), x.strides());
        EXPECT_TRUE(close(on_cpu(ab.dx), eb.dx, 4 * tol));
        EXPECT_TRUE(close(on_cpu(ab.dweight), eb.dweight, dt == DType::f64 ? 1e-10 : 1e-4));
        EXPECT_TRUE(close(on_cpu(ab.dbias), eb.dbias, dt == DType::f64 ? 1e-10 : 1e-4));
        // Note [Determinism]: a second run gives the same bits.
        const kernels::BatchNormForward af2 =
            kernels::batch_norm_forward(x, w.to(kGpu), b.to(kGpu), 1e-5);
        const kernels::BatchNormBackward ab2 =
            kernels::batch_norm_backward(g, x, w.to(kGpu), af.mean, af.invstd, true);
        EXPECT_TRUE(test::all_equal(on_cpu(af2.out), on_cpu(af.out)));
        EXPECT_TRUE(test::all_equal(on_cpu(ab2.dx), on_cpu(ab.dx)));
        EXPECT_TRUE(test::all_equal(on_cpu(ab2.dweight), on_cpu(ab.dweight)));
      }
    }
  }
}

TEST(GpuBatchNorm, merging_statistics_matches_the_cpu_reference) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64}) {
    const int64_t c = 700;  // more channels than threads: the block loops
    const Tensor count = full({1}, 37.0, DType::f64);
    const Tensor mean = test::random_normal({c}, DType::f64, kCpu, 5.0);
    const Tensor m2 = test::random_uniform({c}, 1.0, 9.0, DType::f64);
    const Tensor bm = test::random_normal({c}, dt), bv = test::random_uniform({c}, 0.5, 3.0, dt);
    Tensor gc = count.to(kGpu), gm = mean.to(kGpu), gm2 = m2.to(kGpu);
    kernels::batch_norm_merge_statistics(gc, gm, gm2, bm.to(kGpu), bv.to(kGpu), 12.0);
    kernels::batch_norm_merge_statistics(count, mean, m2, bm, bv, 12.0);
    EXPECT_TRUE(test::all_equal(on_cpu(gc), count));
    EXPECT_TRUE(close(on_cpu(gm), mean, 1e-14));
    EXPECT_TRUE(close(on_cpu(gm2), m2, 1e-14));
    // Adoption: the same roundings as the CPU (no fused multiply-add).
    const Tensor rm = test::random_normal({c}, DType::f64),
                 rv = test::random_uniform({c}, 1, 2, DType::f64);
    Tensor grm = rm.to(kGpu), grv = rv.to(kGpu), gc2 = count.to(kGpu), gmean = mean.to(kGpu),
           gm22 = m2.to(kGpu);
    kernels::batch_norm_adopt_statistics(grm, grv, gc2, gmean, gm22, 0.1);
    kernels::batch_norm_adopt_statistics(rm, rv, count, mean, m2, 0.1);
    EXPECT_TRUE(test::all_equal(on_cpu(grm), rm));
    EXPECT_TRUE(test::all_equal(on_cpu(grv), rv));
    EXPECT_TRUE(test::all_equal(on_cpu(gmean), mean));
    EXPECT_TRUE(test::all_equal(on_cpu(gc2), count));
    // Note [Non-finite window statistics]: a NaN in a channel that thread 0
    // does not read keeps every channel.
    const Tensor bad_mean = test::random_normal({c}, DType::f64);
    bad_mean.data<double>()[c - 3] = std::numeric_limits<double>::quiet_NaN();
    const Tensor grm0 = on_cpu(grm), grv0 = on_cpu(grv);
    Tensor gc3 = full({1}, 9.0, DType::f64).to(kGpu), gbad = bad_mean.to(kGpu),
           gm23 = test::random_uniform({c}, 1.0, 9.0, DType::f64).to(kGpu);
    kernels::batch_norm_adopt_statistics(grm, grv, gc3, gbad, gm23, 0.1);
    EXPECT_TRUE(test::all_equal(on_cpu(grm), grm0));
    EXPECT_TRUE(test::all_equal(on_cpu(grv), grv0));
    EXPECT_TRUE(test::all_equal(on_cpu(gbad), zeros({c}, DType::f64)));
    EXPECT_EQ(on_cpu(gc3).data<double>()[0], 0.0);
  }
}

// Note [Channels-last results] on CUDA: the layout is kept and the values are
// the CPU's (one f32 operation each, so exactly).
TEST(GpuChannelsLast, elementwise_results_keep_the_layout_and_the_cpu_values) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor a = test::random_normal({8, 64, 14, 14}), c = test::random_normal({8, 64, 14, 14});
  const Tensor bias = test::random_normal({1, 64, 1, 1});
  const Tensor al = test::as_channels_last(a.to(kGpu)), cl = test::as_channels_last(c.to(kGpu));
  const Tensor results[][2] = {
      {kernels::unary(kernels::UnaryOp::Relu, al), kernels::unary(kernels::UnaryOp::Relu, a)},
      {kernels::binary(kernels::BinaryOp::Add, al, cl),
       kernels::binary(kernels::BinaryOp::Add, a, c)},
      {kernels::binary(kernels::BinaryOp::Mul, al, bias.to(kGpu)),
       kernels::binary(kernels::BinaryOp::Mul, a, bias)},
      {kernels::unary_backward(kernels::UnaryOp::Relu, cl, al, Tensor(), 0.0),
       kernels::unary_backward(kernels::UnaryOp::Relu, c, a, Tensor(), 0.0)},
  };
  for (const auto& r : results) {
    EXPECT_EQ(r[0].strides(), al.strides());
    EXPECT_TRUE(test::all_equal(on_cpu(r[0]), r[1]));
  }
}

}  // namespace
}  // namespace accrue
