// The CUDA elementwise kernels (binary, scalar, unary and their gradients,
// minimum/maximum, clamp, masked_fill, tril/triu, compare, where, axpy_)
// against the CPU reference: the same public API on CPU
// tensors and on GPU copies of them, with fresh random inputs. Integer-valued
// inputs make add/sub/mul exact, so those compare bit for bit. Shapes cover
// the vectorized contiguous path (with tails and misaligned views), the
// strided path (broadcasts, transposes) and a few-million-element case.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const BinaryOp kBinaryOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
const UnaryOp kUnaryOps[] = {UnaryOp::Neg,  UnaryOp::Exp,  UnaryOp::Log,   UnaryOp::Sqrt,
                             UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Gelu,  UnaryOp::Sigmoid,
                             UnaryOp::Pow,  UnaryOp::Silu, UnaryOp::Rsqrt, UnaryOp::Sin,
                             UnaryOp::Cos,  UnaryOp::Abs};

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}
Tensor cpu(const Tensor& t) {
  return t.to(kCpu);
}

// Best effort at poisoning outputs that the API allocates itself: the device
// pool hands freed blocks back out, so the next allocation of this size (made
// right after, with the inputs already on the GPU) is likely to land on
// NaN-filled memory, and an element a kernel forgets to write then fails the
// comparison.
void poison_pool(int64_t numel, DType dtype) {
  Tensor t = empty({numel}, dtype, kGpu);
  test::poison(t);
}

std::string trace(DType dt, const std::string& what) {
  return std::string(dtype_name(dt)) + " " + what;
}

// Inputs where every op is defined and well conditioned: positive for Log,
// Sqrt, Rsqrt and the fractional Pow, normal elsewhere.
Tensor unary_input(UnaryOp op, const Shape& shape, DType dt) {
  if (op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Pow || op == UnaryOp::Rsqrt)
    return test::random_uniform(shape, 0.25, 3.0, dt);
  return test::random_normal(shape, dt);
}

// Transcendentals differ by an ulp or two of fp32 between the CUDA math library
// and the host's; in 16-bit that can flip one rounding step of the result.
double unary_rtol(UnaryOp op, DType dt) {
  const bool exact_math = op == UnaryOp::Neg || op == UnaryOp::Relu || op == UnaryOp::Abs;
  const bool half = dt == DType::bf16 || dt == DType::f16;
  return test::default_rtol(dt) * (exact_math || !half ? 1.0 : 2.0);
}

// ---- binary ------------------------------------------------------------------------

TEST(GpuBinary, small_integers_are_exact_and_div_is_close_for_every_dtype_and_size) {
  ACCRUE_REQUIRE_CUDA();
  // 1 and 7: tail only; 4099: packs plus a tail; 3M + 3: a few thousand blocks.
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{3000003}}) {
    for (DType dt : kFloatTypes) {
      const Tensor a = test::random_integers({n}, -8, 8, dt);
      const Tensor b = test::random_integers({n}, 1, 8, dt);
      for (BinaryOp op : kBinaryOps) {
        SCOPED_TRACE(trace(dt, std::string(kernels::op_name(op)) + " n=" + std::to_string(n)));
        const Tensor expected = kernels::binary(op, a, b);
        const Tensor ga = gpu(a), gb = gpu(b);
        poison_pool(n, dt);
        const Tensor actual = cpu(kernels::binary(op, ga, gb));
        if (op == BinaryOp::Div) {
          EXPECT_TRUE(test::all_close(actual, expected));
        } else {
          EXPECT_TRUE(test::all_equal(actual, expected));
        }
      }
    }
  }
}

TEST(GpuBinary, random_normals_match_the_reference) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    const Tensor a = test::random_normal({513, 77}, dt);
    const Tensor b = test::random_normal({513, 77}, dt);
    for (BinaryOp op : kBinaryOps) {
      SCOPED_TRACE(trace(dt, kernels::op_name(op)));
      EXPECT_TRUE(
          test::all_close(cpu(kernels::binary(op, gpu(a), gpu(b))), kernels::binary(op, a, b)));
    }
  }
}

TEST(GpuBinary, broadcast_and_strided_inputs_take_the_strided_path) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    // [64, 1, 33] with [17, 33]: broadcast on both sides.
    const Tensor a = test::random_integers({64, 1, 33}, -8, 8, dt);
    const Tensor b = test::random_integers({17, 33}, -8, 8, dt);
    // A transposed (non-contiguous) view against a contiguous tensor.
    const Tensor c = test::random_integers({33, 40}, -8, 8, dt);
    const Tensor d = test::random_integers({40, 33}, -8, 8, dt);
    // A bias add: [N, D] + [D].
    const Tensor x = test::random_normal({300, 129}, dt);
    const Tensor bias = test::random_normal({129}, dt);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
      SCOPED_TRACE(trace(dt, kernels::op_name(op)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::binary(op, gpu(a), gpu(b))), kernels::binary(op, a, b)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::binary(op, gpu(c).transpose(0, 1), gpu(d))),
                                  kernels::binary(op, c.transpose(0, 1), d)));
      EXPECT_TRUE(test::all_close(cpu(kernels::binary(op, gpu(x), gpu(bias))),
                                  kernels::binary(op, x, bias)));
    }
    const Tensor q = test::random_normal({40, 33}, dt);
    EXPECT_TRUE(test::all_close(cpu(kernels::binary(BinaryOp::Div, gpu(q), gpu(c).transpose(0, 1))),
                                kernels::binary(BinaryOp::Div, q, c.transpose(0, 1))));
  }
}

// Note [Rows of packs]: views whose innermost collapsed dim is contiguous in
// every operand (or a splat: one value a row) and a whole number of 16-byte
// packs run by rows of packs; a
// misaligned start or a ragged row falls back to the per-element path. Both
// sides of each boundary, exact on integer-valued inputs.
TEST(GpuBinary, rows_of_packs_match_the_reference_and_fall_back_cleanly) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    const Tensor scores = test::random_integers({2, 3, 64, 64}, -8, 8, dt);
    const Tensor mask = test::random_integers({64, 64}, -8, 8, dt);  // [B, H, T, T] + [T, T]
    const Tensor wide = test::random_integers({16, 97}, -8, 8, dt);
    const Tensor block = test::random_integers({16, 32}, -8, 8, dt);
    const Tensor heads = test::random_integers({2, 16, 3, 8}, -8, 8, dt);
    const Tensor split = test::random_integers({2, 3, 16, 8}, -8, 8, dt);
    const Tensor ragged = test::random_integers({16, 30}, -8, 8, dt);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
      SCOPED_TRACE(trace(dt, kernels::op_name(op)));
      auto check = [&](const Tensor& a, const Tensor& b, auto view_a, const char* what) {
        SCOPED_TRACE(what);
        EXPECT_TRUE(test::all_equal(cpu(kernels::binary(op, view_a(gpu(a)), gpu(b))),
                                    kernels::binary(op, view_a(a), b)));
      };
      auto same = [](const Tensor& t) { return t; };
      check(scores, mask, same, "mask broadcast");
      check(
          wide, block, [](const Tensor& t) { return t.narrow(1, 32, 32); }, "column block");
      check(
          wide, block, [](const Tensor& t) { return t.narrow(1, 1, 32); }, "misaligned block");
      check(
          wide, ragged, [](const Tensor& t) { return t.narrow(1, 64, 30); }, "ragged rows");
      check(
          heads, split,
          [](const Tensor& t) {
            return t.permute({0, 2, 1, 3});
          },
          "head split");
      // One value a row (stride 0 along the packs: a splat), as a per-row scale is.
      check(block, test::random_integers({16, 1}, -8, 8, dt), same, "per-row splat");
      check(test::random_integers({16, 1}, -8, 8, dt), block, same, "splat first");
    }
  }
}

TEST(GpuBinary, misaligned_contiguous_views_are_correct) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // Views one element into their storage: contiguous, but no longer 16-byte
    // aligned, so the kernel must fall back from vector loads.
    const Tensor a = test::random_integers({10001}, -8, 8, dt);
    const Tensor b = test::random_integers({10001}, -8, 8, dt);
    const Tensor ga = gpu(a), gb = gpu(b);
    EXPECT_TRUE(test::all_equal(
        cpu(kernels::binary(BinaryOp::Mul, ga.narrow(0, 1, 10000), gb.narrow(0, 0, 10000))),
        kernels::binary(BinaryOp::Mul, a.narrow(0, 1, 10000), b.narrow(0, 0, 10000))));
    EXPECT_TRUE(test::all_equal(
        cpu(kernels::binary(BinaryOp::Add, ga.narrow(0, 3, 9998), gb.narrow(0, 3, 9998))),
        kernels::binary(BinaryOp::Add, a.narrow(0, 3, 9998), b.narrow(0, 3, 9998))));
  }
}

// ---- binary_scalar -----------------------------------------------------------------------

TEST(GpuBinaryScalar, every_op_both_operand_orders_contiguous_and_strided) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    const Tensor ints = test::random_integers({1001, 9}, 1, 8, dt);
    const Tensor normals = test::random_normal({1001, 9}, dt);
    for (BinaryOp op : kBinaryOps) {
      for (bool scalar_first : {false, true}) {
        SCOPED_TRACE(trace(dt, std::string(kernels::op_name(op)) +
                                   (scalar_first ? " scalar first" : " scalar second")));
        const Tensor g = gpu(ints);
        if (op == BinaryOp::Div) {
          EXPECT_TRUE(test::all_close(cpu(kernels::binary_scalar(op, g, 3.0, scalar_first)),
                                      kernels::binary_scalar(op, ints, 3.0, scalar_first)));
        } else {
          EXPECT_TRUE(test::all_equal(cpu(kernels::binary_scalar(op, g, 3.0, scalar_first)),
                                      kernels::binary_scalar(op, ints, 3.0, scalar_first)));
        }
        // Strided: a transposed view; a scalar that is not a small integer.
        EXPECT_TRUE(test::all_close(
            cpu(kernels::binary_scalar(op, gpu(normals).transpose(0, 1), -0.37, scalar_first)),
            kernels::binary_scalar(op, normals.transpose(0, 1), -0.37, scalar_first)));
      }
    }
  }
}

// ---- unary and unary_backward ---------------------------------------------------------------

TEST(GpuUnary, every_op_matches_the_reference_in_every_dtype) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (UnaryOp op : kUnaryOps) {
      // 4099: vector packs and a tail; [37, 29] transposed: the strided path.
      const Tensor x = unary_input(op, {4099}, dt);
      const Tensor s = unary_input(op, {37, 29}, dt);
      for (double p : {2.5, 3.0}) {
        if (op != UnaryOp::Pow && p != 2.5) continue;
        SCOPED_TRACE(trace(dt, std::string(kernels::op_name(op)) + " p=" + std::to_string(p)));
        const double rtol = unary_rtol(op, dt), atol = test::default_atol(dt);
        const Tensor gx = gpu(x);
        poison_pool(x.numel(), dt);
        EXPECT_TRUE(
            test::all_close(cpu(kernels::unary(op, gx, p)), kernels::unary(op, x, p), rtol, atol));
        EXPECT_TRUE(test::all_close(cpu(kernels::unary(op, gpu(s).transpose(0, 1), p)),
                                    kernels::unary(op, s.transpose(0, 1), p), rtol, atol));
      }
    }
  }
}

TEST(GpuUnary, large_input_exercises_the_bulk_path) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::Exp}) {
      SCOPED_TRACE(trace(dt, kernels::op_name(op)));
      const Tensor x = test::random_normal({3000005}, dt);
      const Tensor gx = gpu(x);
      poison_pool(x.numel(), dt);
      EXPECT_TRUE(test::all_close(cpu(kernels::unary(op, gx)), kernels::unary(op, x),
                                  unary_rtol(op, dt), test::default_atol(dt)));
    }
  }
}

TEST(GpuUnary, backward_of_every_op_matches_the_reference) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (UnaryOp op : kUnaryOps) {
      for (double p : {2.5, 0.0}) {
        if (op != UnaryOp::Pow && p != 2.5) continue;
        SCOPED_TRACE(trace(dt, std::string(kernels::op_name(op)) + " p=" + std::to_string(p)));
        const double rtol = unary_rtol(op, dt), atol = test::default_atol(dt);
        // Contiguous, with a tail.
        const Tensor x = unary_input(op, {2053}, dt);
        const Tensor g = test::random_normal({2053}, dt);
        const Tensor y = kernels::unary(op, x, p);
        const Tensor gg = gpu(g), gx = gpu(x), gy = gpu(y);
        poison_pool(x.numel(), dt);
        EXPECT_TRUE(test::all_close(cpu(kernels::unary_backward(op, gg, gx, gy, p)),
                                    kernels::unary_backward(op, g, x, y, p), rtol, atol));
        // Strided: a transposed gradient and input, a contiguous output.
        const Tensor xt = unary_input(op, {31, 45}, dt);
        const Tensor gt = test::random_normal({31, 45}, dt);
        const Tensor ys = kernels::unary(op, xt.transpose(0, 1), p);
        EXPECT_TRUE(test::all_close(
            cpu(kernels::unary_backward(op, gpu(gt).transpose(0, 1), gpu(xt).transpose(0, 1),
                                        gpu(ys), p)),
            kernels::unary_backward(op, gt.transpose(0, 1), xt.transpose(0, 1), ys, p), rtol,
            atol));
      }
    }
  }
}

// ---- minimum, maximum, clamp and their gradients ---------------------------------------------

// A selection is exact on both backends: every result is an input, a bound or half a gradient.
TEST(GpuMinMax, forward_and_backward_are_exact_with_broadcasting_strides_and_nan) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    // Contiguous with a tail; ties are frequent among few distinct values.
    const Tensor a = test::random_integers({4099}, -3, 3, dt);
    const Tensor b = test::random_integers({4099}, -3, 3, dt);
    const Tensor g = test::random_integers({4099}, -9, 9, dt);
    // Broadcast and strided: [64, 1, 33] against a transposed [33, 17].
    const Tensor c = test::random_normal({64, 1, 33}, dt);
    const Tensor d = test::random_normal({33, 17}, dt);
    const Tensor gc = test::random_normal({64, 17, 33}, dt);
    // NaN in either operand.
    const Tensor n1 = from_vector<double>({NAN, 1.0, 2.0, NAN, 4.0}, {5}).to(dt);
    const Tensor n2 = from_vector<double>({1.0, NAN, 3.0, NAN, 4.0}, {5}).to(dt);
    for (BinaryOp op : {BinaryOp::Min, BinaryOp::Max}) {
      SCOPED_TRACE(trace(dt, kernels::op_name(op)));
      const Tensor ga = gpu(a), gb = gpu(b);
      poison_pool(a.numel(), dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::binary(op, ga, gb)), kernels::binary(op, a, b)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::binary(op, gpu(c), gpu(d).transpose(0, 1))),
                                  kernels::binary(op, c, d.transpose(0, 1))));
      EXPECT_TRUE(test::all_equal(cpu(kernels::binary_scalar(op, gpu(c), 0.25, true)),
                                  kernels::binary_scalar(op, c, 0.25, true)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::binary(op, gpu(n1), gpu(n2))), kernels::binary(op, n1, n2)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::minmax_backward(op, gpu(g), gpu(a), gpu(b))),
                                  kernels::minmax_backward(op, g, a, b)));
      EXPECT_TRUE(test::all_equal(
          cpu(kernels::minmax_backward(op, gpu(gc), gpu(d).transpose(0, 1), gpu(c))),
          kernels::minmax_backward(op, gc, d.transpose(0, 1), c)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::minmax_backward(op, gpu(n1), gpu(n1), gpu(n2))),
                                  kernels::minmax_backward(op, n1, n1, n2)));
    }
  }
}

TEST(GpuClamp, forward_and_backward_match_the_cpu_exactly) {
  ACCRUE_REQUIRE_CUDA();
  using Bounds = std::pair<std::optional<double>, std::optional<double>>;
  const Bounds cases[] = {{-1.0, 0.5}, {std::nullopt, 0.25}, {-0.75, std::nullopt}};
  for (DType dt : kFloatTypes) {
    const Tensor x = test::random_normal({2053}, dt, kCpu, 2.0);
    const Tensor g = test::random_normal({2053}, dt);
    const Tensor s = test::random_normal({31, 45}, dt, kCpu, 2.0);
    const Tensor cl = test::as_channels_last(test::random_normal({2, 3, 4, 5}, dt));
    // Bounds hit exactly, and NaN.
    const Tensor edge = from_vector<double>({-1.0, 0.5, NAN, -2.0, 2.0}, {5}).to(dt);
    for (const auto& [lo, hi] : cases) {
      SCOPED_TRACE(trace(dt, std::string("clamp ") + (lo ? std::to_string(*lo) : "none") + " " +
                                 (hi ? std::to_string(*hi) : "none")));
      const Tensor gx = gpu(x);
      poison_pool(x.numel(), dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::clamp(gx, lo, hi)), kernels::clamp(x, lo, hi)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::clamp(gpu(s).transpose(0, 1), lo, hi)),
                                  kernels::clamp(s.transpose(0, 1), lo, hi)));
      // Tensor::to makes a dense copy: the layout is set again on the GPU.
      const Tensor gcl = kernels::clamp(test::as_channels_last(gpu(cl)), lo, hi);
      EXPECT_TRUE(gcl.is_channels_last());
      EXPECT_TRUE(test::all_equal(cpu(gcl), kernels::clamp(cl, lo, hi)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::clamp(gpu(edge), lo, hi)), kernels::clamp(edge, lo, hi)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::clamp_backward(gpu(g), gpu(x), lo, hi)),
                                  kernels::clamp_backward(g, x, lo, hi)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::clamp_backward(gpu(edge), gpu(edge), lo, hi)),
                                  kernels::clamp_backward(edge, edge, lo, hi)));
    }
  }
}

// ---- masked_fill, where with a scalar, tril and triu -------------------------------------------

TEST(GpuMaskedFill, matches_the_cpu_exactly_for_every_dtype_and_layout) {
  ACCRUE_REQUIRE_CUDA();
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
  for (DType dt : dtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_integers({4, 65, 33}, -100, 100, DType::i64).to(dt);
    const Tensor mask = test::random_integers({65, 1}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor full_mask =
        test::random_integers({4, 65, 33}, 0, 1, DType::i64).to(DType::boolean);
    EXPECT_TRUE(test::all_equal(cpu(kernels::masked_fill(gpu(x), gpu(mask), -7.0)),
                                kernels::masked_fill(x, mask, -7.0)));
    EXPECT_TRUE(test::all_equal(cpu(kernels::masked_fill(gpu(x), gpu(full_mask), 3.0)),
                                kernels::masked_fill(x, full_mask, 3.0)));
    EXPECT_TRUE(test::all_equal(
        cpu(kernels::masked_fill(gpu(x).transpose(1, 2), gpu(mask).view({65}), 1.0)),
        kernels::masked_fill(x.transpose(1, 2), mask.view({65}), 1.0)));
    const Tensor cond = test::random_integers({4, 1, 33}, 0, 1, DType::i64).to(DType::boolean);
    EXPECT_TRUE(
        test::all_equal(cpu(kernels::where(gpu(cond), gpu(x), 2.0)), kernels::where(cond, x, 2.0)));
    EXPECT_TRUE(test::all_equal(cpu(kernels::where(gpu(cond), -5.0, gpu(x))),
                                kernels::where(cond, -5.0, x)));
  }
  // Rows of packs (Note [Rows of packs]): the fill value a splat, the [T, T]
  // mask of [B, H, T, T] scores, a per-row mask (a splat too), and a view one
  // element off its storage's alignment that falls back.
  for (DType dt : dtypes) {
    SCOPED_TRACE(std::string("rows of packs, ") + dtype_name(dt));
    const Tensor scores = test::random_integers({2, 3, 64, 64}, -100, 100, DType::i64).to(dt);
    const Tensor causal = test::random_integers({64, 64}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor per_row = test::random_integers({64, 1}, 0, 1, DType::i64).to(DType::boolean);
    EXPECT_TRUE(test::all_equal(cpu(kernels::masked_fill(gpu(scores), gpu(causal), -9.0)),
                                kernels::masked_fill(scores, causal, -9.0)));
    EXPECT_TRUE(test::all_equal(cpu(kernels::masked_fill(gpu(scores), gpu(per_row), 4.0)),
                                kernels::masked_fill(scores, per_row, 4.0)));
    const Tensor flat = test::random_integers({1 + 4 * 64}, -100, 100, DType::i64).to(dt);
    const Tensor off = flat.narrow(0, 1, 4 * 64).view({4, 64});
    const Tensor gpu_off = gpu(flat).narrow(0, 1, 4 * 64).view({4, 64});
    EXPECT_TRUE(
        test::all_equal(cpu(kernels::masked_fill(gpu_off, gpu(per_row).narrow(0, 0, 4), 6.0)),
                        kernels::masked_fill(off, per_row.narrow(0, 0, 4), 6.0)));
    const Tensor cond = test::random_integers({4, 1, 32}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor x = test::random_integers({4, 16, 32}, -100, 100, DType::i64).to(dt);
    EXPECT_TRUE(
        test::all_equal(cpu(kernels::where(gpu(cond), gpu(x), 2.0)), kernels::where(cond, x, 2.0)));
  }
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // A channels-last activation keeps its layout; -inf as an attention mask fills.
    const Tensor cl = test::as_channels_last(test::random_normal({2, 8, 5, 6}, dt));
    const Tensor mask = test::random_integers({6}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor out = kernels::masked_fill(test::as_channels_last(gpu(cl)), gpu(mask), -INFINITY);
    EXPECT_TRUE(out.is_channels_last());
    EXPECT_TRUE(test::all_equal(cpu(out), kernels::masked_fill(cl, mask, -INFINITY)));
  }
}

TEST(GpuTriangle, tril_and_triu_match_the_cpu_for_every_dtype_diagonal_and_layout) {
  ACCRUE_REQUIRE_CUDA();
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16,   DType::f16,
                          DType::i32, DType::i64, DType::boolean};
  for (DType dt : dtypes) {
    const int hi = dt == DType::boolean ? 1 : 100;
    const Tensor x =
        test::random_integers({3, 2, 67, 45}, dt == DType::boolean ? 0 : -100, hi, DType::i64)
            .to(dt);
    for (int64_t diagonal : {-70, -3, 0, 5, 50}) {
      SCOPED_TRACE(trace(dt, "diagonal " + std::to_string(diagonal)));
      const Tensor gx = gpu(x);
      poison_pool(x.numel(), dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::tril(gx, diagonal)), kernels::tril(x, diagonal)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::triu(gpu(x), diagonal)), kernels::triu(x, diagonal)));
      // Strided: the last two dims transposed; a channels-last view.
      EXPECT_TRUE(test::all_equal(cpu(kernels::tril(gpu(x).transpose(2, 3), diagonal)),
                                  kernels::tril(x.transpose(2, 3), diagonal)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::triu(gpu(x).permute({0, 3, 1, 2}), diagonal)),
                                  kernels::triu(x.permute({0, 3, 1, 2}), diagonal)));
    }
    // Rows of whole 16-byte packs (48 columns, any dtype) take the pack kernel,
    // which writes packs outside the triangle without reading them; the same
    // shape one element off its storage's alignment does not.
    const Tensor flat =
        test::random_integers({1 + 3 * 40 * 48}, dt == DType::boolean ? 0 : -100, hi, DType::i64)
            .to(dt);
    const Tensor packed = flat.narrow(0, 0, 3 * 40 * 48).view({3, 40, 48});
    const Tensor shifted = flat.narrow(0, 1, 3 * 40 * 48).view({3, 40, 48});
    const Tensor gflat = gpu(flat);
    const Tensor gpacked = gflat.narrow(0, 0, 3 * 40 * 48).view({3, 40, 48});
    const Tensor gshifted = gflat.narrow(0, 1, 3 * 40 * 48).view({3, 40, 48});
    for (int64_t diagonal : {-45, -7, -1, 0, 1, 3, 16, 47, 60}) {
      SCOPED_TRACE(trace(dt, "packed rows, diagonal " + std::to_string(diagonal)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::triu(gpacked, diagonal)), kernels::triu(packed, diagonal)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::tril(gpacked, diagonal)), kernels::tril(packed, diagonal)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::triu(gshifted, diagonal)),
                                  kernels::triu(shifted, diagonal)));
    }
  }
}

// Note [Capturable code]: the new pointwise ops (scalar operands of where and
// masked_fill included, which make a 0-d tensor) capture into a CUDA graph,
// and its replay on new input values equals the eager ops.
TEST(GpuPointwise, new_ops_capture_in_a_cuda_graph_and_replay_on_new_values) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  const Tensor x = gpu(test::random_normal({8, 33}));
  const Tensor y = gpu(test::random_normal({33}));
  const Tensor mask = gpu(test::random_integers({8, 1}, 0, 1, DType::i64).to(DType::boolean));
  auto ops = [&] {
    Tensor h = kernels::unary(UnaryOp::Silu, x);
    h = kernels::binary(BinaryOp::Add, h, kernels::unary(UnaryOp::Sin, x));
    h = kernels::binary(BinaryOp::Mul, h, kernels::unary(UnaryOp::Cos, y));
    h = kernels::binary(BinaryOp::Max, h, kernels::unary(UnaryOp::Abs, y));
    h = kernels::binary(BinaryOp::Min, h,
                        kernels::unary(UnaryOp::Rsqrt, kernels::unary(UnaryOp::Abs, x)));
    h = kernels::clamp(h, -1.5, 2.5);
    h = kernels::masked_fill(h, mask, -3.0);
    h = kernels::where(mask, 0.25, kernels::tril(h, 3));
    h = kernels::binary(BinaryOp::Add, kernels::triu(h, -2),
                        kernels::minmax_backward(BinaryOp::Max, h, x, y));
    return kernels::clamp_backward(h, x, -0.5, std::nullopt);
  };
  const Tensor warm = ops();  // a first eager run, as every capture wants
  const Tensor result = empty(warm.shape(), DType::f32, kGpu);
  std::string why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
      0, [&] { result.copy_(ops()); }, &why);
  ASSERT_TRUE(graph) << why;
  x.copy_(test::random_normal({8, 33}));  // new values in the captured buffers
  y.copy_(test::random_normal({33}));
  graph->launch();
  EXPECT_TRUE(test::all_equal(cpu(result), cpu(ops())));
  EXPECT_FALSE(test::all_equal(cpu(result), cpu(warm)));
}

// ---- compare and where -------------------------------------------------------------------------

TEST(GpuCompare, every_op_and_dtype_is_exact_including_broadcast) {
  ACCRUE_REQUIRE_CUDA();
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16,   DType::f16,
                          DType::i32, DType::i64, DType::boolean};
  const CompareOp ops[] = {CompareOp::Eq, CompareOp::Ne, CompareOp::Lt,
                           CompareOp::Le, CompareOp::Gt, CompareOp::Ge};
  for (DType dt : dtypes) {
    // Few distinct values, so that every op is true and false somewhere.
    const int hi = dt == DType::boolean ? 1 : 3;
    const Tensor a = test::random_integers({129, 33}, 0, hi, DType::i64).to(dt);
    const Tensor b = test::random_integers({129, 33}, 0, hi, DType::i64).to(dt);
    const Tensor row = test::random_integers({1, 33}, 0, hi, DType::i64).to(dt);
    for (CompareOp op : ops) {
      SCOPED_TRACE(trace(dt, "op " + std::to_string(static_cast<int>(op))));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::compare(op, gpu(a), gpu(b))), kernels::compare(op, a, b)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::compare(op, gpu(a), gpu(row))),
                                  kernels::compare(op, a, row)));
      EXPECT_TRUE(
          test::all_equal(cpu(kernels::compare(op, gpu(a).transpose(0, 1), gpu(b).transpose(0, 1))),
                          kernels::compare(op, a.transpose(0, 1), b.transpose(0, 1))));
    }
  }
}

TEST(GpuWhere, selects_exactly_for_every_dtype_contiguous_and_broadcast) {
  ACCRUE_REQUIRE_CUDA();
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
  for (DType dt : dtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor cond = test::random_integers({257, 65}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor a = test::random_integers({257, 65}, -100, 100, DType::i64).to(dt);
    const Tensor b = test::random_integers({257, 65}, -100, 100, DType::i64).to(dt);
    EXPECT_TRUE(test::all_equal(cpu(kernels::where(gpu(cond), gpu(a), gpu(b))),
                                kernels::where(cond, a, b)));
    // cond per row, b a single value: the strided path.
    const Tensor row_cond = test::random_integers({257, 1}, 0, 1, DType::i64).to(DType::boolean);
    const Tensor one = test::random_integers({1}, 1, 9, DType::i64).to(dt);
    EXPECT_TRUE(test::all_equal(cpu(kernels::where(gpu(row_cond), gpu(a), gpu(one))),
                                kernels::where(row_cond, a, one)));
  }
}

// ---- axpy_ -----------------------------------------------------------------------------------

TEST(GpuAxpy, contiguous_broadcast_and_strided_destinations) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // Exact: integers and alpha = 2.
    {
      const Tensor src = test::random_integers({1003, 7}, -8, 8, dt);
      Tensor expected = test::random_integers({1003, 7}, -50, 50, dt);
      Tensor actual = gpu(expected);
      kernels::axpy_(expected, 2.0, src);
      kernels::axpy_(actual, 2.0, gpu(src));
      EXPECT_TRUE(test::all_equal(cpu(actual), expected));
    }
    // Broadcast src [7] into dst [1003, 7], a non-integer alpha.
    {
      const Tensor src = test::random_normal({7}, dt);
      Tensor expected = test::random_normal({1003, 7}, dt);
      Tensor actual = gpu(expected);
      kernels::axpy_(expected, -0.37, src);
      kernels::axpy_(actual, -0.37, gpu(src));
      EXPECT_TRUE(test::all_close(cpu(actual), expected));
    }
    // A strided destination: the odd columns of a wider matrix. Every other
    // element of the storage must stay bitwise untouched.
    {
      const Tensor src = test::random_integers({300, 20}, -8, 8, dt);
      Tensor base_expected = test::random_integers({300, 41}, -50, 50, dt);
      Tensor base_actual = gpu(base_expected);
      kernels::axpy_(base_expected.narrow(1, 1, 20), 3.0, src);
      kernels::axpy_(base_actual.narrow(1, 1, 20), 3.0, gpu(src));
      EXPECT_TRUE(test::all_equal(cpu(base_actual), base_expected));
      // And a transposed one.
      const Tensor src_t = test::random_integers({41, 300}, -8, 8, dt);
      kernels::axpy_(base_expected.transpose(0, 1), -1.0, src_t);
      kernels::axpy_(base_actual.transpose(0, 1), -1.0, gpu(src_t));
      EXPECT_TRUE(test::all_equal(cpu(base_actual), base_expected));
    }
  }
}

// Note [Mixed axpy]: a bf16/f16 src into an f32 dst (one pass on CUDA) and
// every other pair (converted first) add bitwise what the conversion and then
// the add give on the CPU, contiguous, strided and broadcast.
TEST(GpuAxpy, a_src_of_another_dtype_matches_the_cpu_bit_for_bit) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dst_dtype : kFloatTypes) {
    for (DType src_dtype : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(src_dtype)) + " into " + dtype_name(dst_dtype));
      const Tensor base = test::random_normal({301, 67}, dst_dtype);
      const Tensor src = test::random_normal({67, 301}, src_dtype);
      const Tensor row = test::random_normal({67}, src_dtype);
      Tensor expected = base.clone(), actual = gpu(base);
      // alpha 2 and -1: exact products, so the GPU's fused multiply-add and
      // the CPU's multiply then add round alike.
      kernels::axpy_(expected, 2.0, src.transpose(0, 1).to(dst_dtype));
      kernels::axpy_(actual, 2.0, gpu(src).transpose(0, 1));
      kernels::axpy_(expected.narrow(0, 1, 100), -1.0, row.to(dst_dtype));
      kernels::axpy_(actual.narrow(0, 1, 100), -1.0, gpu(row));
      EXPECT_TRUE(test::all_equal(cpu(actual), expected));
    }
  }
}

}  // namespace
}  // namespace accrue
