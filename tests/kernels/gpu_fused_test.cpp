// The CUDA transformer kernels against the CPU reference, on fresh random
// inputs: dropout bit for bit (one Philox mask for both devices), linear +
// bias + GELU and linear + bias through the cuBLASLt epilogues and their
// fallbacks (Note [GELU epilogue], Note [Bias epilogue]), the residual add
// fused with LayerNorm, RMSNorm and its residual form, the rotary embedding and
// SwiGLU (each also captured into a CUDA graph).
#include <gmock/gmock.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/dropout.h"
#include "accrue/kernels/fused.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"
#ifdef ACCRUE_WITH_CUDA
#include "accrue/kernels/fused_backend.h"
#endif

namespace accrue {
namespace {

using test::close;
using test::Tf32Scope;

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

// ---- the GELU gradient in the GEMM epilogue --------------------------------------------------

// matmul_gelu_backward on the GPU against the CPU's two ops, at row counts
// where it runs the two ops on CUDA too (Note [GELU gradient epilogue]; the
// epilogue's own test is below): dtype tolerances.
void expect_matmul_gelu_backward_matches_cpu(int64_t n, int64_t out, int64_t hidden, DType dt) {
  const Tensor g = test::random_normal({n, out}, dt);
  const Tensor w =
      test::random_normal({out, hidden}, dt, kCpu, 1.0 / std::sqrt(static_cast<double>(out)));
  const Tensor pre = test::random_normal({n, hidden}, dt, kCpu, 1.5);
  EXPECT_TRUE(close(kernels::matmul_gelu_backward(g.to(kGpu), w.to(kGpu), pre.to(kGpu)),
                    kernels::matmul_gelu_backward(g, w, pre), test::normalized_tolerance(dt)));
}

TEST(GpuLinearGelu, matmul_gelu_backward_below_the_epilogue_rows_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  struct Case {
    int64_t n, out, hidden;
  };
  // GPT-2 small's MLP (768 -> 3072, 512 tokens) and odd shapes, hidden = 36
  // among them (aux ld not a multiple of 8, which the epilogue could not take).
  const Case cases[] = {{512, 768, 3072}, {37, 24, 40}, {37, 24, 36}, {1, 7, 16}, {300, 64, 8}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.n) +
                   " out=" + std::to_string(c.out) + " hidden=" + std::to_string(c.hidden));
      expect_matmul_gelu_backward_matches_cpu(c.n, c.out, c.hidden, dt);
    }
  }
  // Below the epilogue's rows, CUDA runs the two ops: their bits.
  const Tensor g0 = test::random_normal({512, 768}, DType::bf16).to(kGpu);
  const Tensor w0 = test::random_normal({768, 3072}, DType::bf16, kCpu, 0.05).to(kGpu);
  const Tensor p0 = test::random_normal({512, 3072}, DType::bf16, kCpu, 1.5).to(kGpu);
  EXPECT_TRUE(test::all_equal(on_cpu(kernels::matmul_gelu_backward(g0, w0, p0)),
                              on_cpu(kernels::gelu_backward(kernels::matmul(g0, w0), p0))));
  // Strided views are read as the matrices they show.
  // g [32, 48] and pre [32, 64] as transposes, w [48, 64] as stored.
  const Tensor g = test::random_normal({48, 32}, DType::bf16).to(kGpu);
  const Tensor w = test::random_normal({48, 64}, DType::bf16, kCpu, 0.2).to(kGpu);
  const Tensor pre = test::random_normal({64, 32}, DType::bf16).to(kGpu);
  EXPECT_TRUE(close(kernels::matmul_gelu_backward(g.transpose(0, 1), w, pre.transpose(0, 1)),
                    kernels::matmul_gelu_backward(on_cpu(g).transpose(0, 1), on_cpu(w),
                                                  on_cpu(pre).transpose(0, 1)),
                    test::normalized_tolerance(DType::bf16)));
}

#ifdef ACCRUE_WITH_CUDA
// The DGELU epilogue itself, which matmul_gelu_backward takes only from
// 32,768 rows: against the CPU's two ops (it rounds the product once where
// they round twice: dtype tolerances) at GPT-2 small's MLP shape, the same
// bits on a second call with new pointers, declined where it cannot run; and
// matmul_gelu_backward at 32,768 rows, against the two ops on the GPU.
TEST(GpuLinearGelu, dgelu_epilogue_matches_cpu_where_supported) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  auto run = [](int64_t n, int64_t out, int64_t hidden, DType dt, int copies) {
    const Tensor g = test::random_normal({n, out}, dt);
    const Tensor w = test::random_normal({out, hidden}, dt, kCpu, 0.05);
    const Tensor pre = test::random_normal({n, hidden}, dt, kCpu, 1.5);
    std::vector<Tensor> results{kernels::matmul_gelu_backward(g, w, pre)};
    for (int i = 0; i < copies; ++i) {
      results.push_back(empty({n, hidden}, dt, kGpu));
      if (!kernels::cuda::gemm_dgelu(g.to(kGpu), w.to(kGpu), pre.to(kGpu), results.back()))
        return std::vector<Tensor>{};
    }
    return results;
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<Tensor> r = run(512, 768, 3072, dt, 2);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_TRUE(close(r[1], r[0], test::normalized_tolerance(dt)));
    EXPECT_TRUE(test::all_equal(on_cpu(r[1]), on_cpu(r[2])));
  }
  const std::vector<Tensor> odd = run(37, 24, 40, DType::bf16, 1);
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_TRUE(close(odd[1], odd[0], test::normalized_tolerance(DType::bf16)));
  EXPECT_TRUE(run(8, 16, 36, DType::bf16, 1).empty());  // aux ld 36
  EXPECT_TRUE(run(8, 16, 32, DType::f64, 1).empty());   // no f64 epilogue

  // From 32,768 rows matmul_gelu_backward is the epilogue (its bits), within
  // bf16's tolerance of the two ops on the GPU.
  const Tensor g = test::random_normal({32768, 768}, DType::bf16).to(kGpu);
  const Tensor w = test::random_normal({768, 3072}, DType::bf16, kCpu, 0.05).to(kGpu);
  const Tensor pre = test::random_normal({32768, 3072}, DType::bf16, kCpu, 1.5).to(kGpu);
  const Tensor dpre = empty({32768, 3072}, DType::bf16, kGpu);
  ASSERT_TRUE(kernels::cuda::gemm_dgelu(g, w, pre, dpre));
  const Tensor node = kernels::matmul_gelu_backward(g, w, pre);
  EXPECT_TRUE(test::all_equal(on_cpu(node), on_cpu(dpre)));
  EXPECT_TRUE(close(node, on_cpu(kernels::gelu_backward(kernels::matmul(g, w), pre)),
                    test::normalized_tolerance(DType::bf16)));
}
#endif

// The MLP node (linear_gelu_linear) on the GPU against the CPU: the output
// and all five gradients.
TEST(GpuLinearGelu, linear_gelu_linear_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = test::random_normal({2, 64, 96}, dt);
    const Tensor w10 = test::random_normal({256, 96}, dt, kCpu, 0.1),
                 b10 = test::random_normal({256}, dt, kCpu, 0.5),
                 w20 = test::random_normal({96, 256}, dt, kCpu, 0.06),
                 b20 = test::random_normal({96}, dt);
    const Tensor g = test::random_normal({2, 64, 96}, dt);
    auto run = [&](Device device) {
      const Tensor x = fresh_leaf(x0, device), w1 = fresh_leaf(w10, device),
                   b1 = fresh_leaf(b10, device), w2 = fresh_leaf(w20, device),
                   b2 = fresh_leaf(b20, device);
      const Tensor y = linear_gelu_linear(x, w1, b1, w2, b2);
      backward(y, g.to(device));
      return std::vector<Tensor>{y, grad(x), grad(w1), grad(b1), grad(w2), grad(b2)};
    };
    const std::vector<Tensor> expected = run(kCpu), actual = run(kGpu);
    const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2"};
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(close(actual[i], expected[i], test::normalized_tolerance(dt))) << names[i];
  }
}

// ---- linear: the bias in the GEMM epilogue ---------------------------------------------------

// The forward of kernels::linear, and the autograd Linear's forward and
// backward (dx, dW, db), on the GPU against the CPU. The CUDA result rounds
// x W^T + b once, the CPU's twice (Note [Bias epilogue]): dtype tolerances.
void expect_linear_matches_cpu(const LinearGeluInputs& in, double tol) {
  const Tensor y_cpu = kernels::linear(in.x, in.w, in.b);
  const Tensor y_gpu = kernels::linear(in.x.to(kGpu), in.w.to(kGpu), in.b.to(kGpu));
  EXPECT_EQ(y_gpu.shape(), y_cpu.shape());
  EXPECT_EQ(y_gpu.dtype(), y_cpu.dtype());
  EXPECT_TRUE(close(y_gpu, y_cpu, tol)) << "kernels::linear";

  const Tensor g = test::random_normal(y_cpu.shape(), y_cpu.dtype());
  auto run = [&](Device device) {
    const Tensor x = fresh_leaf(in.x, device), w = fresh_leaf(in.w, device),
                 b = fresh_leaf(in.b, device);
    const Tensor y = linear(x, w, b);
    backward(y, g.to(device));
    return std::vector<Tensor>{y, grad(x), grad(w), grad(b)};
  };
  const std::vector<Tensor> expected = run(kCpu), actual = run(kGpu);
  const char* names[] = {"autograd output", "dx", "dweight", "dbias"};
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(close(actual[i], expected[i], tol)) << names[i];
}

TEST(GpuLinear, gpt2_qkv_shape_f32_true_fp32_bf16_and_f16_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // GPT-2 small's attention input projection: 768 -> 2304, 512 tokens.
    // TF32 would miss the f32 tolerance by orders of magnitude.
    expect_linear_matches_cpu(make_inputs(512, 768, 2304, dt), test::normalized_tolerance(dt));
  }
}

TEST(GpuLinear, odd_shapes_f64_and_the_fallback_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  struct Case {
    int64_t n, in, out;
  };
  // Odd out-features and leading dimensions (the heuristic may decline them:
  // then matmul + add runs), in = 1, and f64 (always the fallback).
  const Case cases[] = {{37, 24, 40}, {37, 24, 36}, {1, 7, 3},
                        {5, 1, 16},   {300, 64, 8}, {33, 17, 5}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.n) +
                   " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out));
      expect_linear_matches_cpu(make_inputs(c.n, c.in, c.out, dt), test::normalized_tolerance(dt));
    }
  }
  // in = 0: every row is the bias. N = 0: an empty [0, out].
  const Tensor b = test::random_normal({3}, DType::bf16);
  const Tensor y = kernels::linear(empty({2, 0}, DType::bf16, kGpu),
                                   empty({3, 0}, DType::bf16, kGpu), b.to(kGpu));
  EXPECT_TRUE(test::all_equal(on_cpu(y), b.unsqueeze(0).expand({2, 3}).contiguous()));
  const Tensor none = kernels::linear(empty({0, 8}, DType::bf16, kGpu),
                                      test::random_normal({3, 8}, DType::bf16, kGpu), b.to(kGpu));
  EXPECT_EQ(none.shape(), (Shape{0, 3}));
}

TEST(GpuLinear, three_d_input_through_autograd_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const LinearGeluInputs in = make_inputs(4 * 64, 768, 768, DType::bf16);
  const Tensor x3 = in.x.reshape({4, 64, 768});
  const Tensor g = test::random_normal({4, 64, 768}, DType::bf16);
  auto run = [&](Device device) {
    const Tensor x = fresh_leaf(x3, device), w = fresh_leaf(in.w, device),
                 b = fresh_leaf(in.b, device);
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{4, 64, 768}));
    backward(y, g.to(device));
    return std::vector<Tensor>{y, grad(x), grad(w), grad(b)};
  };
  const std::vector<Tensor> expected = run(kCpu), actual = run(kGpu);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(close(actual[i], expected[i], test::normalized_tolerance(DType::bf16)))
        << "result " << i;
}

TEST(GpuLinear, misaligned_bias_strided_operands_and_tf32_still_match) {
  ACCRUE_REQUIRE_CUDA();
  const double tol = test::normalized_tolerance(DType::bf16);
  const LinearGeluInputs in = make_inputs(64, 96, 128, DType::bf16);
  const Tensor y_cpu = kernels::linear(in.x, in.w, in.b);
  // A bias one element into its buffer: 2-byte aligned, which the heuristic
  // is told through the bias pointer (the plan key has that alignment).
  const Tensor buffer = empty({129}, DType::bf16, kGpu);
  const Tensor bias = make_view(buffer, {128}, {1}, buffer.offset() + 1);
  bias.copy_(in.b.to(kGpu));
  EXPECT_TRUE(close(kernels::linear(in.x.to(kGpu), in.w.to(kGpu), bias), y_cpu, tol));
  // Transposed views of the input and the weight (copied for the epilogue GEMM).
  const Tensor xt = in.x.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1);
  const Tensor wt = in.w.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_TRUE(close(kernels::linear(xt, wt, in.b.to(kGpu)), y_cpu, tol));
  // f32 follows allow_tf32(): with TF32 the result changes and stays within
  // TF32's precision; without it, it is true fp32.
  const LinearGeluInputs f = make_inputs(256, 768, 256, DType::f32);
  const Tensor f_cpu = kernels::linear(f.x, f.w, f.b);
  Tensor fp32, tf32;
  {
    Tf32Scope scope(false);
    fp32 = kernels::linear(f.x.to(kGpu), f.w.to(kGpu), f.b.to(kGpu));
  }
  {
    Tf32Scope scope(true);
    tf32 = kernels::linear(f.x.to(kGpu), f.w.to(kGpu), f.b.to(kGpu));
  }
  EXPECT_TRUE(close(fp32, f_cpu, test::normalized_tolerance(DType::f32)));
  EXPECT_TRUE(close(tf32, f_cpu, 5e-3));
  EXPECT_FALSE(test::all_equal(on_cpu(tf32), on_cpu(fp32)));
}

#ifdef ACCRUE_WITH_CUDA
// The epilogue itself runs for GPT-2's biased Linears (so the tests above
// cover it, not only the fallback), kernels::linear takes it, and it declines
// what it cannot run.
TEST(GpuLinear, cublaslt_bias_epilogue_runs_where_supported) {
  ACCRUE_REQUIRE_CUDA();
  Tf32Scope tf32(false);
  auto run = [](const LinearGeluInputs& in, Tensor* out) {
    *out = empty({in.x.size(0), in.w.size(0)}, in.x.dtype(), kGpu);
    return kernels::cuda::gemm_bias(in.x.to(kGpu), in.w.to(kGpu), in.b.to(kGpu), *out);
  };
  struct Case {
    int64_t n, in, out;
  };
  // Attention input and output projections, the MLP's output projection.
  const Case cases[] = {{512, 768, 2304}, {128, 768, 768}, {128, 3072, 768}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.n) +
                   " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out));
      const LinearGeluInputs in = make_inputs(c.n, c.in, c.out, dt);
      Tensor out;
      ASSERT_TRUE(run(in, &out));
      EXPECT_TRUE(close(out, kernels::linear(in.x, in.w, in.b), test::normalized_tolerance(dt)));
      // Twice: the cached plan with new pointers gives the same bits.
      Tensor again;
      ASSERT_TRUE(run(in, &again));
      EXPECT_TRUE(test::all_equal(on_cpu(again), on_cpu(out)));
      // kernels::linear runs the same plan: the same bits.
      EXPECT_TRUE(test::all_equal(
          on_cpu(kernels::linear(in.x.to(kGpu), in.w.to(kGpu), in.b.to(kGpu))), on_cpu(out)));
    }
  }
  Tensor out;
  EXPECT_FALSE(run(make_inputs(8, 16, 32, DType::f64), &out));  // no f64 epilogue
  const LinearGeluInputs empty_inner{empty({4, 0}, DType::bf16), empty({8, 0}, DType::bf16),
                                     test::random_normal({8}, DType::bf16)};
  EXPECT_FALSE(run(empty_inner, &out));  // K = 0
}

// Rounding once (the epilogue) is more accurate than rounding the product and
// then the sum (matmul then add) against the f64 result, see Note [Bias epilogue].
TEST(GpuLinear, the_epilogue_rounds_once_and_is_closer_to_f64_than_matmul_then_add) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const LinearGeluInputs in = make_inputs(128, 768, 2304, dt);
    const Tensor exact =
        kernels::linear(in.x.to(DType::f64), in.w.to(DType::f64), in.b.to(DType::f64));
    const Tensor x = in.x.to(kGpu), w = in.w.to(kGpu), b = in.b.to(kGpu);
    Tensor fused = empty({128, 2304}, dt, kGpu);
    ASSERT_TRUE(kernels::cuda::gemm_bias(x, w, b, fused));
    const Tensor unfused =
        kernels::binary(kernels::BinaryOp::Add, kernels::matmul(x, w.transpose(0, 1)), b);
    const double err_fused = test::relative_error(on_cpu(fused).to(DType::f64), exact);
    const double err_unfused = test::relative_error(on_cpu(unfused).to(DType::f64), exact);
    EXPECT_LT(err_fused, err_unfused);
    EXPECT_LT(err_fused, test::normalized_tolerance(dt));
  }
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
  EXPECT_ERROR(kernels::linear(x, test::random_normal({3, 8}), test::random_normal({3})), "linear",
               "cuda", "cpu");
  EXPECT_ERROR(
      kernels::linear(x, test::random_normal({3, 8}, DType::f32, kGpu), test::random_normal({3})),
      "linear", "bias", "cuda", "cpu");
}

// ---- RMSNorm -----------------------------------------------------------------------------------

// x one element into a fresh device buffer: contiguous but not 16-byte
// aligned, so the kernels take their scalar paths.
Tensor misaligned_copy(const Tensor& x) {
  const Tensor buffer = empty({x.numel() + 1}, x.dtype(), kGpu);
  const Tensor view =
      make_view(buffer, x.shape(), contiguous_strides(x.shape()), buffer.offset() + 1);
  view.copy_(x.to(kGpu));
  return view;
}

TEST(GpuRmsNorm, forward_matches_cpu_for_warp_and_block_rows_in_every_dtype) {
  ACCRUE_REQUIRE_CUDA();
  // 8 and 128 take a warp per row, 4096 and 8192 a block; 771 and 3 the scalar path.
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t d : {8, 128, 1024, 2048, 4096, 8192, 771, 3}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(d) +
                     (affine ? " weight" : " plain"));
        const int64_t rows = d >= 4096 ? 24 : 133;
        const Tensor x = test::random_normal({rows, d}, dt, kCpu, 2.0);
        const Tensor w = affine ? test::random_normal({d}, dt) : Tensor();
        const kernels::RmsNormOutput e = kernels::rms_norm(x, w, 1e-5);
        const kernels::RmsNormOutput a =
            kernels::rms_norm(x.to(kGpu), affine ? w.to(kGpu) : w, 1e-5);
        EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(dt))) << "out";
        EXPECT_TRUE(close(a.rstd, e.rstd, test::normalized_tolerance(DType::f32))) << "rstd";
        EXPECT_EQ(a.rstd.dtype(), e.rstd.dtype());
        const kernels::RmsNormOutput again =
            kernels::rms_norm(x.to(kGpu), affine ? w.to(kGpu) : w, 1e-5);
        EXPECT_TRUE(test::all_equal(on_cpu(again.out), on_cpu(a.out)));
      }
    }
  }
}

TEST(GpuRmsNorm, f32_weights_misaligned_rows_and_a_per_head_view) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_normal({33, 768}, dt);
    const Tensor w = test::random_normal({768}, DType::f32);
    const kernels::RmsNormOutput e = kernels::rms_norm(x, w, 1e-6);
    const kernels::RmsNormOutput a = kernels::rms_norm(misaligned_copy(x), w.to(kGpu), 1e-6);
    EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(dt)));
  }
  // qk_norm: q of a packed [B, T, 3, H, D] qkv, normalized per head.
  const Tensor qkv = test::random_normal({2, 17, 3, 8, 128}, DType::bf16);
  const Tensor w = test::random_normal({128}, DType::bf16);
  const Tensor q = qkv.select(2, 0);
  const kernels::RmsNormOutput e = kernels::rms_norm(q, w, 1e-6);
  const kernels::RmsNormOutput a = kernels::rms_norm(qkv.to(kGpu).select(2, 0), w.to(kGpu), 1e-6);
  EXPECT_EQ(a.out.shape(), (Shape{2, 17, 8, 128}));
  EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(DType::bf16)));
  // Its backward reads the view in place too (dweight into an fp32 slot).
  const Tensor g = test::random_normal({2, 17, 8, 128}, DType::bf16);
  const Tensor dwe = empty({128}, DType::f32), dwa = empty({128}, DType::f32, kGpu);
  const Tensor dxe = kernels::rms_norm_backward(g, q, w, e.rstd, dwe, false);
  const Tensor dxa = kernels::rms_norm_backward(g.to(kGpu), qkv.to(kGpu).select(2, 0), w.to(kGpu),
                                                a.rstd, dwa, false);
  EXPECT_TRUE(close(dxa, dxe, test::normalized_tolerance(DType::bf16))) << "dx";
  EXPECT_TRUE(close(dwa, dwe, test::normalized_tolerance(DType::bf16))) << "dweight";
}

TEST(GpuRmsNorm, backward_matches_cpu_and_writes_or_adds_dweight) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    // Note [RMSNorm backward]: 4096 16-bit values a row are 2 packs a thread,
    // 9600 are 3 (the fused sums sized for 2 and 3), and 20000 is wider than
    // the fused column sums take.
    for (int64_t d : {64, 771, 4096, 9600, 20000}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(d));
      const int64_t rows = d > 4096 ? 70 : 300;
      const Tensor x = test::random_normal({rows, d}, dt);
      const Tensor g = test::random_normal({rows, d}, dt);
      const Tensor w = test::random_normal({d}, dt);
      const DType wdt = dt == DType::f64 ? DType::f64 : DType::f32;  // an arena slot's dtype
      const kernels::RmsNormOutput fe = kernels::rms_norm(x, w, 1e-5);
      const Tensor dwe = empty({d}, wdt);
      const Tensor dxe = kernels::rms_norm_backward(g, x, w, fe.rstd, dwe, false);
      const Tensor xg = x.to(kGpu), gg = g.to(kGpu), wg = w.to(kGpu);
      const kernels::RmsNormOutput fa = kernels::rms_norm(xg, wg, 1e-5);
      const Tensor dwa = full({d}, 5.0, wdt, kGpu);  // stale values: written over
      const Tensor dxa = kernels::rms_norm_backward(gg, xg, wg, fa.rstd, dwa, false);
      EXPECT_TRUE(close(dxa, dxe, test::normalized_tolerance(dt))) << "dx";
      EXPECT_TRUE(close(dwa, dwe, test::normalized_tolerance(dt))) << "dweight";
      kernels::rms_norm_backward(gg, xg, wg, fa.rstd, dwa, true);
      EXPECT_TRUE(close(dwa, kernels::binary_scalar(kernels::BinaryOp::Mul, dwe, 2.0),
                        test::normalized_tolerance(dt)))
          << "accumulated dweight";
    }
  }
}

// dx_add (Note [Fan-out sums in the backward]) against the CPU's: rows of a
// warp group (768: Llama-125m's), of a block (4096), a width of no whole
// packs (771) and an unaligned dx_add (the scalar kernels).
TEST(GpuRmsNorm, backward_adds_dx_add_on_every_path) {
  ACCRUE_REQUIRE_CUDA();
  struct Case {
    int64_t rows, d;
    bool unaligned_add;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : {Case{300, 768, false}, Case{70, 4096, false}, Case{50, 771, false},
                          Case{64, 768, true}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(c.rows) + "x" +
                   std::to_string(c.d) + (c.unaligned_add ? " unaligned" : ""));
      const Tensor x = test::random_normal({c.rows, c.d}, dt);
      const Tensor g = test::random_normal({c.rows, c.d}, dt);
      const Tensor w = test::random_normal({c.d}, DType::f32);
      const int64_t n = c.rows * c.d, shift = c.unaligned_add ? 1 : 0;
      const Tensor add_buffer = test::random_normal({n + 1}, dt);
      const Tensor add = add_buffer.narrow(0, shift, n).reshape({c.rows, c.d});
      const kernels::RmsNormOutput f = kernels::rms_norm(x, w, 1e-5);
      kernels::NormPartials p, p_g;
      const Tensor dx = kernels::rms_norm_backward_partials(g, x, w, f.rstd, true, &p, add);
      const Tensor dx_g = kernels::rms_norm_backward_partials(
          g.to(kGpu), x.to(kGpu), w.to(kGpu), f.rstd.to(kGpu), true, &p_g,
          add_buffer.to(kGpu).narrow(0, shift, n).reshape({c.rows, c.d}));
      EXPECT_TRUE(close(dx_g, dx, test::normalized_tolerance(dt))) << "dx";
      const Tensor dw = empty({c.d}), dw_g = empty({c.d}, DType::f32, kGpu);
      kernels::norm_param_totals(p, dw, Tensor(), false);
      kernels::norm_param_totals(p_g, dw_g, Tensor(), false);
      EXPECT_TRUE(close(dw_g, dw, test::normalized_tolerance(dt))) << "dweight";
    }
  }
}

// Rows of 16 and 8 packs take 16 and 8 lanes (Note [RMSNorm kernels]); more
// rows than the backward's warp groups (4096), not a multiple of them, give the
// groups different row counts, while every lane of a warp must join its shuffles.
// A partial row of column sums per block: 512 (768, a Llama-125m row of 96
// packs: 32 lanes) take the two-level total (kSpan spans first), 256 (128: 16
// lanes) and 128 (64: 8 lanes) the one-level one.
TEST(GpuRmsNorm, sub_warp_rows_past_the_group_count_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (int64_t d : {128, 64, 768}) {
    SCOPED_TRACE("D=" + std::to_string(d));
    const int64_t rows = 2 * 8192 + 5;
    const Tensor x = test::random_normal({rows, d}, DType::bf16);
    const Tensor g = test::random_normal({rows, d}, DType::bf16);
    const Tensor w = test::random_normal({d}, DType::f32);
    const kernels::RmsNormOutput fe = kernels::rms_norm(x, w, 1e-6);
    const kernels::RmsNormOutput fa = kernels::rms_norm(x.to(kGpu), w.to(kGpu), 1e-6);
    EXPECT_TRUE(close(fa.out, fe.out, test::normalized_tolerance(DType::bf16))) << "out";
    const Tensor dwe = empty({d}, DType::f32), dwa = empty({d}, DType::f32, kGpu);
    const Tensor dxe = kernels::rms_norm_backward(g, x, w, fe.rstd, dwe, false);
    const Tensor dxa =
        kernels::rms_norm_backward(g.to(kGpu), x.to(kGpu), w.to(kGpu), fa.rstd, dwa, false);
    EXPECT_TRUE(close(dxa, dxe, test::normalized_tolerance(DType::bf16))) << "dx";
    EXPECT_TRUE(close(dwa, dwe, test::normalized_tolerance(DType::bf16))) << "dweight";
    // Note [Deterministic column sums]: the same shape adds in the same order.
    const Tensor again = empty({d}, DType::f32, kGpu);
    kernels::rms_norm_backward(g.to(kGpu), x.to(kGpu), w.to(kGpu), fa.rstd, again, false);
    EXPECT_TRUE(test::all_equal(on_cpu(again), on_cpu(dwa))) << "dweight run to run";
  }
}

TEST(GpuAddRmsNorm, matches_cpu_and_the_sum_is_bitwise) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t d : {128, 4096, 771}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(d));
      const Tensor x = test::random_normal({65, d}, dt);
      const Tensor res = test::random_normal({65, d}, dt, kCpu, 2.0);
      const Tensor w = test::random_normal({d}, dt);
      const kernels::ResidualRmsNormOutput e = kernels::add_rms_norm(x, res, w, 1e-6);
      const kernels::ResidualRmsNormOutput a =
          kernels::add_rms_norm(x.to(kGpu), res.to(kGpu), w.to(kGpu), 1e-6);
      EXPECT_TRUE(test::all_equal(on_cpu(a.sum), e.sum));
      EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(dt)));
      EXPECT_TRUE(close(a.rstd, e.rstd, test::normalized_tolerance(DType::f32)));
    }
  }
  const Tensor x = test::random_normal({9, 256}, DType::bf16);
  const Tensor w = test::random_normal({256}, DType::f32);
  const kernels::ResidualRmsNormOutput e = kernels::add_rms_norm(x, x, w, 1e-6);
  const kernels::ResidualRmsNormOutput a =
      kernels::add_rms_norm(misaligned_copy(x), x.to(kGpu), w.to(kGpu), 1e-6);
  EXPECT_TRUE(test::all_equal(on_cpu(a.sum), e.sum));
  EXPECT_TRUE(close(a.out, e.out, test::normalized_tolerance(DType::bf16)));
}

// ---- rotary embedding
// ------------------------------------------------------------------------------

Tensor random_positions(const Shape& shape, int64_t hi) {
  const std::vector<double> u =
      test::random_uniform({shape_numel(shape)}, 0.0, static_cast<double>(hi)).to_vector<double>();
  std::vector<int64_t> p(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    p[i] = static_cast<int64_t>(u[i]);
  return from_vector<int64_t>(p, shape);
}

TEST(GpuRope, matches_cpu_for_both_styles_scalings_and_head_dims) {
  ACCRUE_REQUIRE_CUDA();
  const RopeScaling llama3 = RopeScaling::llama3(8.0, 1.0, 4.0, 8192);
  // 64 and 128 vectorized; 6 the scalar path; 1024 more pairs than the shared inv_freq table.
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t d : {64, 128, 6, 1024}) {
      for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
        for (const RopeScaling& s : {RopeScaling{}, llama3}) {
          for (bool inverse : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(d) +
                         (style == RopeStyle::RotateHalf ? " rotate_half" : " interleaved") +
                         (s.type == RopeScaling::Type::llama3 ? " llama3" : "") +
                         (inverse ? " inverse" : ""));
            const Tensor x = test::random_normal({2, 37, 3, d}, dt);
            const Tensor pos = random_positions({2, 37}, 9000);
            const Tensor e = kernels::rope(x, pos, 500000.0, style, s, inverse);
            const Tensor a = kernels::rope(x.to(kGpu), pos.to(kGpu), 500000.0, style, s, inverse);
            EXPECT_TRUE(close(a, e, test::normalized_tolerance(dt)));
          }
        }
      }
    }
  }
}

// A long batch (12,003 tokens, odd) as a model's training step gives it.
TEST(GpuRope, a_long_batch_of_an_odd_token_count) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({3, 4001, 2, 128}, DType::bf16);
  const Tensor pos = random_positions({3, 4001}, 8192);
  const Tensor e = kernels::rope(x, pos, 10000.0, RopeStyle::RotateHalf);
  const Tensor a = kernels::rope(x.to(kGpu), pos.to(kGpu), 10000.0, RopeStyle::RotateHalf);
  EXPECT_TRUE(close(a, e, test::normalized_tolerance(DType::bf16)));
}

TEST(GpuRope, q_and_k_of_a_packed_qkv_shared_positions_and_a_misaligned_input) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t b = 2, t = 50, h = 8, d = 64;
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor qkv = test::random_normal({b, t, 3 * h * d}, dt);
    const Tensor qkv_gpu = qkv.to(kGpu);
    const Tensor pos = random_positions({t}, 2048);
    for (int64_t which : {0, 1}) {
      const Tensor e = kernels::rope(qkv.view({b, t, 3, h, d}).select(2, which), pos, 10000.0,
                                     RopeStyle::RotateHalf);
      const Tensor a = kernels::rope(qkv_gpu.view({b, t, 3, h, d}).select(2, which), pos.to(kGpu),
                                     10000.0, RopeStyle::RotateHalf);
      EXPECT_TRUE(close(a, e, test::normalized_tolerance(dt)));
    }
    const Tensor x = test::random_normal({b, t, h, d}, dt);
    const Tensor e = kernels::rope(x, pos, 10000.0, RopeStyle::Interleaved);
    const Tensor a =
        kernels::rope(misaligned_copy(x), pos.to(kGpu), 10000.0, RopeStyle::Interleaved);
    EXPECT_TRUE(close(a, e, test::normalized_tolerance(dt)));
  }
}

TEST(GpuRope, in_place_on_q_of_a_packed_qkv_matches_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t b = 2, t = 33, h = 8, d = 128;
  for (RopeStyle style : {RopeStyle::RotateHalf, RopeStyle::Interleaved}) {
    const Tensor qkv = test::random_normal({b, t, 3 * h * d}, DType::bf16);
    const Tensor pos = random_positions({b, t}, 4096);
    const Tensor expected =
        kernels::rope(qkv.view({b, t, 3, h, d}).select(2, 0), pos, 500000.0, style);
    const Tensor gpu_qkv = qkv.to(kGpu);
    kernels::rope_(gpu_qkv.view({b, t, 3, h, d}).select(2, 0), pos.to(kGpu), 500000.0, style);
    const Tensor after = on_cpu(gpu_qkv).view({b, t, 3, h, d});
    EXPECT_TRUE(
        close(after.select(2, 0).contiguous(), expected, test::normalized_tolerance(DType::bf16)));
    EXPECT_TRUE(test::all_equal(after.select(2, 1).contiguous(),
                                qkv.view({b, t, 3, h, d}).select(2, 1).contiguous()));
  }
}

TEST(GpuRope, a_bad_position_is_an_error_naming_it) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({1, 3, 2, 8}, DType::f32, kGpu);
  EXPECT_ERROR(
      kernels::rope(x, from_vector<int64_t>({0, 7, -2}, {3}).to(kGpu), 1e4, RopeStyle::RotateHalf),
      "rope", "positions", "-2");
  EXPECT_ERROR(kernels::rope(x, from_vector<int64_t>({0, 1, 2}, {3}), 1e4, RopeStyle::RotateHalf),
               "rope", "positions", "cuda", "cpu");
}

// ---- SwiGLU
// ---------------------------------------------------------------------------------------

TEST(GpuSwiglu, forward_and_backward_match_cpu_split_and_packed) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t f : {1376, 11, 4096}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " F=" + std::to_string(f));
      const Tensor x = test::random_normal({3, 7, 2 * f}, dt, kCpu, 3.0);
      const Tensor dy = test::random_normal({3, 7, f}, dt);
      const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu);
      const double tol = test::normalized_tolerance(dt);
      EXPECT_TRUE(close(kernels::swiglu_packed(xg), kernels::swiglu_packed(x), tol));
      EXPECT_TRUE(close(kernels::swiglu_packed_backward(dyg, xg),
                        kernels::swiglu_packed_backward(dy, x), tol));
      // Dense split operands (the flat path).
      const Tensor gate = x.narrow(2, 0, f).contiguous(), up = x.narrow(2, f, f).contiguous();
      const Tensor gg = gate.to(kGpu), ug = up.to(kGpu);
      EXPECT_TRUE(close(kernels::swiglu(gg, ug), kernels::swiglu(gate, up), tol));
      const kernels::SwigluGrads e = kernels::swiglu_backward(dy, gate, up);
      const kernels::SwigluGrads a = kernels::swiglu_backward(dyg, gg, ug);
      EXPECT_TRUE(close(a.dgate, e.dgate, tol)) << "dgate";
      EXPECT_TRUE(close(a.dup, e.dup, tol)) << "dup";
    }
  }
  const Tensor g = test::random_normal({5, 64}, DType::bf16),
               u = test::random_normal({5, 64}, DType::bf16);
  EXPECT_TRUE(close(kernels::swiglu(misaligned_copy(g), u.to(kGpu)), kernels::swiglu(g, u),
                    test::normalized_tolerance(DType::bf16)));
}

// ---- through autograd and in a CUDA graph -------------------------------------------------------

TEST(GpuModernBlock, autograd_gradients_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const int64_t b = 2, t = 16, h = 4, d = 64, c = h * d;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = test::random_normal({b, t, c}, dt), r0 = test::random_normal({b, t, c}, dt);
    const Tensor w0 = test::random_normal({c}, dt), qw0 = test::random_normal({d}, dt);
    const Tensor up0 = test::random_normal({b, t, c}, dt);
    const Tensor pos = random_positions({b, t}, 4096);
    auto grads = [&](Device device) {
      const Tensor x = fresh_leaf(x0, device), r = fresh_leaf(r0, device);
      const Tensor w = fresh_leaf(w0, device), qw = fresh_leaf(qw0, device);
      const Tensor up = fresh_leaf(up0, device);
      const ResidualNorm n = add_rms_norm(x, r, w);
      const Tensor heads = reshape(n.normed, {b, t, h, d});
      const Tensor q = rope(qk_norm(heads, qw), pos.to(device), 10000.0, RopeStyle::RotateHalf);
      const Tensor y = swiglu(reshape(q, {b, t, c}), up) + n.sum;
      backward(sum(y * y));
      return std::vector<Tensor>{grad(x), grad(r), grad(w), grad(qw), grad(up)};
    };
    const std::vector<Tensor> expected = grads(kCpu), actual = grads(kGpu);
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(close(actual[i], expected[i], 4 * test::normalized_tolerance(dt)))
          << "input " << i;
  }
}

// Note [Capturable code]: with the eager position check off (a Window defers
// it instead), the forward and backward kernels record into a CUDA graph
// whose replay on new inputs equals the eager calls.
TEST(GpuModernBlock, the_kernels_capture_into_a_cuda_graph) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  test::CheckIndicesScope no_checks(false);
  const int64_t b = 2, t = 8, h = 4, d = 32, c = h * d;
  const Tensor x = test::random_normal({b, t, c}, DType::bf16, kGpu);
  const Tensor res = test::random_normal({b, t, c}, DType::bf16, kGpu);
  const Tensor w = test::random_normal({c}, DType::f32, kGpu);
  const Tensor pos = random_positions({b, t}, 100).to(kGpu);
  const auto ops = [&] {
    const kernels::ResidualRmsNormOutput n = kernels::add_rms_norm(x, res, w, 1e-6);
    const Tensor q = kernels::rope(n.out.view({b, t, h, d}), pos, 1e4, RopeStyle::RotateHalf);
    const Tensor back = kernels::rope(q, pos, 1e4, RopeStyle::RotateHalf, {}, true);
    const Tensor dw = empty({c}, DType::f32, kGpu);
    const Tensor dx = kernels::rms_norm_backward(back.view({b, t, c}), n.sum, w, n.rstd, dw, false);
    const Tensor s =
        kernels::swiglu_packed(kernels::binary(kernels::BinaryOp::Add, dx.view({b, t, c}), n.sum));
    return kernels::swiglu_packed_backward(s, dx.view({b, t, c}));
  };
  const Tensor warm = ops();
  const Tensor result = empty(warm.shape(), DType::bf16, kGpu);
  std::string why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
      0, [&] { result.copy_(ops()); }, &why);
  ASSERT_TRUE(graph) << why;
  x.copy_(test::random_normal({b, t, c}, DType::bf16));
  graph->launch();
  EXPECT_TRUE(test::all_equal(on_cpu(result), on_cpu(ops())));
  EXPECT_FALSE(test::all_equal(on_cpu(result), on_cpu(warm)));
}

TEST(GpuModernBlock, inputs_on_two_devices_are_errors) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({4, 8}, DType::f32, kGpu);
  EXPECT_ERROR(kernels::rms_norm(x, test::random_normal({8}), 1e-5), "rms_norm", "weight", "cuda",
               "cpu");
  EXPECT_ERROR(kernels::add_rms_norm(x, test::random_normal({4, 8}), Tensor(), 1e-5),
               "add_rms_norm", "cuda", "cpu");
  EXPECT_ERROR(kernels::swiglu(x, test::random_normal({4, 8})), "swiglu", "cuda", "cpu");
}

}  // namespace
}  // namespace accrue
