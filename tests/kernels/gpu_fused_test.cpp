// The CUDA transformer kernels against the CPU reference, on fresh random
// inputs: dropout bit for bit (one Philox mask for both devices), linear +
// bias + GELU through the cuBLASLt epilogue and its fallback (Note [GELU
// epilogue]), and the residual add fused with LayerNorm.
#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/transformer_ops.h"
#include "autograd/variable.h"
#include "kernels/dropout.h"
#include "kernels/fused.h"
#include "kernels/ops.h"
#include "tests/test_util.h"
#ifdef ACCRUE_WITH_CUDA
#include "kernels/fused_backend.h"
#endif

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

Tensor on_cpu(const Tensor& t) {
  return t.to(kCpu);
}

// A new leaf that requires grad with t's values on `device` (never t itself,
// which to() returns when t is already there).
Tensor fresh_leaf(const Tensor& t, Device device) {
  return requires_grad_(device == t.device() ? t.clone() : t.to(device));
}

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, double tol) {
  const double err = test::relative_error(on_cpu(actual), expected);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " > " << tol;
}

// Sets whether f32 GEMMs may use TF32 for the scope of a test.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allow) : previous_(kernels::allow_tf32()) {
    kernels::set_allow_tf32(allow);
  }
  ~Tf32Scope() { kernels::set_allow_tf32(previous_); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool previous_;
};

// ---- dropout ----------------------------------------------------------------------------

TEST(GpuDropout, forward_and_backward_are_bit_identical_to_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Shape& shape : {Shape{1000003}, Shape{37, 29}, Shape{1}}) {
      for (double p : {0.1, 0.5, 0.87}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) +
                     " p=" + std::to_string(p));
        const Tensor x = test::random_normal(shape, dt);
        const uint64_t seed = 0x9E3779B97F4A7C15ull, offset = 12345;  // a 64-bit seed, odd offset
        EXPECT_TRUE(test::all_equal(on_cpu(kernels::dropout(x.to(kGpu), p, seed, offset)),
                                    kernels::dropout(x, p, seed, offset)));
        EXPECT_TRUE(test::all_equal(on_cpu(kernels::dropout_backward(x.to(kGpu), p, seed, offset)),
                                    kernels::dropout_backward(x, p, seed, offset)));
      }
    }
  }
}

TEST(GpuDropout, strided_input_counts_row_major_and_mask_matches_rand) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({33, 64});
  const Tensor xt = x.to(kGpu).transpose(0, 1);
  EXPECT_TRUE(test::all_equal(on_cpu(kernels::dropout(xt, 0.3, 5, 77)),
                              kernels::dropout(x.transpose(0, 1), 0.3, 5, 77)));
  // The kept elements are those whose rand() draw at the same state is >= p.
  Generator gen;
  gen.set_state(5, 77);
  const std::vector<double> u = rand({64, 33}, DType::f32, kGpu, &gen).to_vector<double>();
  const std::vector<double> y =
      kernels::dropout(ones({64, 33}, DType::f32, kGpu), 0.3, 5, 77).to_vector<double>();
  for (size_t i = 0; i < u.size(); ++i)
    ASSERT_EQ(y[i] != 0.0, u[i] >= 0.3) << "element " << i;
}

// ---- linear + GELU ------------------------------------------------------------------------

struct LinearGeluInputs {
  Tensor x, w, b;
};

// Weights scaled by 1/sqrt(in): pre-activations of order 1, where GELU bends.
LinearGeluInputs make_inputs(int64_t n, int64_t in, int64_t out, DType dt) {
  return {test::random_normal({n, in}, dt),
          test::random_normal({out, in}, dt, kCpu, 1.0 / std::sqrt(static_cast<double>(in))),
          test::random_normal({out}, dt, kCpu, 0.5)};
}

// The forward (out and pre-activation) and the autograd backward (dx, dW, db)
// of linear_gelu on the GPU against the CPU reference.
void expect_linear_gelu_matches_cpu(const LinearGeluInputs& in, double tol) {
  Tensor pre_cpu, pre_gpu;
  const Tensor y_cpu = kernels::linear_gelu(in.x, in.w, in.b, &pre_cpu);
  const Tensor y_gpu = kernels::linear_gelu(in.x.to(kGpu), in.w.to(kGpu), in.b.to(kGpu), &pre_gpu);
  EXPECT_TRUE(close(pre_gpu, pre_cpu, tol)) << "pre-activation";
  EXPECT_TRUE(close(y_gpu, y_cpu, tol)) << "output";

  const Tensor g = test::random_normal(y_cpu.shape(), y_cpu.dtype());
  // gelu_backward on the same inputs on both devices.
  EXPECT_TRUE(close(kernels::gelu_backward(g.to(kGpu), pre_cpu.to(kGpu)),
                    kernels::gelu_backward(g, pre_cpu), tol))
      << "gelu_backward";
  auto grads = [&](Device device) {
    const Tensor x = fresh_leaf(in.x, device), w = fresh_leaf(in.w, device),
                 b = fresh_leaf(in.b, device);
    backward(linear_gelu(x, w, b), g.to(device));
    return std::vector<Tensor>{grad(x), grad(w), grad(b)};
  };
  const std::vector<Tensor> expected = grads(kCpu), actual = grads(kGpu);
  const char* names[] = {"dx", "dweight", "dbias"};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(close(actual[i], expected[i], tol)) << names[i];
}

TEST(GpuLinearGelu, gpt2_shape_f32_true_fp32_and_bf16_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // GPT-2 small's MLP: 768 -> 3072, 512 tokens. TF32 would miss the f32
    // tolerance by two orders of magnitude.
    expect_linear_gelu_matches_cpu(make_inputs(512, 768, 3072, dt), test::normalized_tolerance(dt));
  }
}

TEST(GpuLinearGelu, odd_shapes_f16_f64_and_the_fallback_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  struct Case {
    int64_t n, in, out;
  };
  // out = 40 can use the epilogue; out = 36 and 3 (aux ld not a multiple of 8)
  // and every f64 case take the fallback.
  const Case cases[] = {{37, 24, 40}, {37, 24, 36}, {1, 7, 3}, {5, 1, 16}, {300, 64, 8}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.n) +
                   " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out));
      expect_linear_gelu_matches_cpu(make_inputs(c.n, c.in, c.out, dt),
                                     test::normalized_tolerance(dt));
    }
  }
}

TEST(GpuLinearGelu, misaligned_bias_strided_input_and_tf32_still_match) {
  ACCRUE_REQUIRE_CUDA();
  const LinearGeluInputs in = make_inputs(64, 96, 128, DType::bf16);
  Tensor pre_cpu;
  const Tensor y_cpu = kernels::linear_gelu(in.x, in.w, in.b, &pre_cpu);
  // A bias one element into its buffer: 2-byte aligned, which the heuristic
  // is told through the bias pointer.
  const Tensor buffer = empty({129}, DType::bf16, kGpu);
  const Tensor bias = make_view(buffer, {128}, {1}, buffer.offset() + 1);
  bias.copy_(in.b.to(kGpu));
  Tensor pre_gpu;
  EXPECT_TRUE(close(kernels::linear_gelu(in.x.to(kGpu), in.w.to(kGpu), bias, &pre_gpu), y_cpu,
                    test::normalized_tolerance(DType::bf16)));
  EXPECT_TRUE(close(pre_gpu, pre_cpu, test::normalized_tolerance(DType::bf16)));
  // A transposed input view (copied for the GEMM).
  const Tensor xt = in.x.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_TRUE(close(kernels::linear_gelu(xt, in.w.to(kGpu), in.b.to(kGpu), nullptr), y_cpu,
                    test::normalized_tolerance(DType::bf16)));
  // f32 with TF32 allowed: the epilogue runs at TF32 precision.
  Tf32Scope tf32(true);
  const LinearGeluInputs f = make_inputs(64, 256, 64, DType::f32);
  EXPECT_TRUE(close(kernels::linear_gelu(f.x.to(kGpu), f.w.to(kGpu), f.b.to(kGpu), nullptr),
                    kernels::linear_gelu(f.x, f.w, f.b, nullptr), 5e-3));
}

#ifdef ACCRUE_WITH_CUDA
// The epilogue itself runs for the shapes it supports (so the tests above
// cover it, not only the fallback) and declines the others.
TEST(GpuLinearGelu, cublaslt_epilogue_runs_where_supported) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  auto run = [](const LinearGeluInputs& in, Tensor* pre, Tensor* out) {
    const int64_t n = in.x.size(0), o = in.w.size(0);
    *pre = empty({n, o}, in.x.dtype(), kGpu);
    *out = empty({n, o}, in.x.dtype(), kGpu);
    return kernels::cuda::gemm_bias_gelu(in.x.to(kGpu), in.w.to(kGpu), in.b.to(kGpu), *pre, *out);
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const LinearGeluInputs in = make_inputs(512, 768, 3072, dt);
    Tensor pre, out, pre_cpu;
    ASSERT_TRUE(run(in, &pre, &out));
    const Tensor y_cpu = kernels::linear_gelu(in.x, in.w, in.b, &pre_cpu);
    EXPECT_TRUE(close(pre, pre_cpu, test::normalized_tolerance(dt)));
    EXPECT_TRUE(close(out, y_cpu, test::normalized_tolerance(dt)));
    // Twice: the cached plan with new pointers gives the same bits.
    Tensor pre2, out2;
    ASSERT_TRUE(run(in, &pre2, &out2));
    EXPECT_TRUE(test::all_equal(on_cpu(out2), on_cpu(out)));
    EXPECT_TRUE(test::all_equal(on_cpu(pre2), on_cpu(pre)));
  }
  Tensor pre, out;
  EXPECT_FALSE(run(make_inputs(8, 16, 36, DType::bf16), &pre, &out));  // aux ld 36
  EXPECT_FALSE(run(make_inputs(8, 16, 32, DType::f64), &pre, &out));   // no f64 epilogue
}
#endif

// ---- residual + layer norm -------------------------------------------------------------------

TEST(GpuResidualLayerNorm, matches_cpu_for_gpt2_widths_and_odd_rows) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t d : {64, 768, 1600, 4096, 8192, 771, 3}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(d) +
                     (affine ? " affine" : " plain"));
        const int64_t rows = d >= 4096 ? 24 : 129;
        const Tensor x = test::random_normal({rows, d}, dt);
        const Tensor res = test::random_normal({rows, d}, dt, kCpu, 2.0);
        const Tensor w = affine ? test::random_normal({d}, dt) : Tensor();
        const Tensor b = affine ? test::random_normal({d}, dt) : Tensor();
        const kernels::ResidualLayerNormOutput e = kernels::residual_layer_norm(x, res, w, b, 1e-5);
        const kernels::ResidualLayerNormOutput a = kernels::residual_layer_norm(
            x.to(kGpu), res.to(kGpu), affine ? w.to(kGpu) : w, affine ? b.to(kGpu) : b, 1e-5);
        // One rounding of one add: the same bits on both devices.
        EXPECT_TRUE(test::all_equal(on_cpu(a.sum), e.sum));
        EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(dt))) << "out";
        EXPECT_TRUE(close(a.mean, e.mean, test::normalized_tolerance(DType::f32))) << "mean";
        EXPECT_TRUE(close(a.rstd, e.rstd, test::normalized_tolerance(DType::f32))) << "rstd";
        EXPECT_EQ(a.mean.dtype(), e.mean.dtype());
        // Deterministic: a second run gives the same bits.
        const kernels::ResidualLayerNormOutput again = kernels::residual_layer_norm(
            x.to(kGpu), res.to(kGpu), affine ? w.to(kGpu) : w, affine ? b.to(kGpu) : b, 1e-5);
        EXPECT_TRUE(test::all_equal(on_cpu(again.out), on_cpu(a.out)));
      }
    }
  }
}

TEST(GpuResidualLayerNorm, f32_parameters_misaligned_rows_and_3d_input) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t rows = 33, d = 768;
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // fp32 master weights next to 16-bit activations.
    const Tensor x = test::random_normal({rows, d}, dt);
    const Tensor res = test::random_normal({rows, d}, dt);
    const Tensor w = test::random_normal({d}, DType::f32), b = test::random_normal({d}, DType::f32);
    const kernels::ResidualLayerNormOutput e = kernels::residual_layer_norm(x, res, w, b, 1e-5);
    // x one element into its buffer: contiguous but not 16-byte aligned, so
    // the kernel takes its scalar path.
    const Tensor buffer = empty({rows * d + 1}, dt, kGpu);
    const Tensor xm = make_view(buffer, {rows, d}, {d, 1}, buffer.offset() + 1);
    xm.copy_(x.to(kGpu));
    const kernels::ResidualLayerNormOutput a =
        kernels::residual_layer_norm(xm, res.to(kGpu), w.to(kGpu), b.to(kGpu), 1e-5);
    EXPECT_TRUE(test::all_equal(on_cpu(a.sum), e.sum));
    EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(dt)));
    EXPECT_TRUE(close(a.rstd, e.rstd, test::normalized_tolerance(DType::f32)));
  }
  const Tensor x3 = test::random_normal({2, 5, 1600});
  const Tensor r3 = test::random_normal({2, 5, 1600});
  const kernels::ResidualLayerNormOutput e =
      kernels::residual_layer_norm(x3, r3, Tensor(), Tensor(), 1e-5);
  const kernels::ResidualLayerNormOutput a =
      kernels::residual_layer_norm(x3.to(kGpu), r3.to(kGpu), Tensor(), Tensor(), 1e-5);
  EXPECT_EQ(a.mean.shape(), (Shape{2, 5}));
  EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(DType::f32)));
}

TEST(GpuResidualLayerNorm, autograd_backward_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = test::random_normal({64, 768}, dt), r0 = test::random_normal({64, 768}, dt);
    const Tensor w0 = test::random_normal({768}, dt), b0 = test::random_normal({768}, dt);
    const Tensor g1 = test::random_normal({64, 768}, dt), g2 = test::random_normal({64, 768}, dt);
    auto grads = [&](Device device) {
      const Tensor x = fresh_leaf(x0, device), r = fresh_leaf(r0, device);
      const Tensor w = fresh_leaf(w0, device), b = fresh_leaf(b0, device);
      const ResidualNorm out = residual_layer_norm(x, r, w, b);
      backward(sum(out.normed * g1.to(device) + out.sum * g2.to(device)));
      return std::vector<Tensor>{grad(x), grad(r), grad(w), grad(b)};
    };
    const std::vector<Tensor> expected = grads(kCpu), actual = grads(kGpu);
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(close(actual[i], expected[i], test::normalized_tolerance(dt))) << "input " << i;
  }
}

TEST(GpuFused, inputs_on_two_devices_are_errors) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({4, 8}, DType::f32, kGpu);
  EXPECT_ERROR(
      kernels::residual_layer_norm(x, test::random_normal({4, 8}), Tensor(), Tensor(), 1e-5),
      "residual_layer_norm", "cuda", "cpu");
  EXPECT_ERROR(
      kernels::linear_gelu(x, test::random_normal({3, 8}), test::random_normal({3}), nullptr),
      "linear_gelu", "cuda", "cpu");
}

}  // namespace
}  // namespace accrue
