// The CUDA reductions (sum, mean, max, argmax over the last dim; sum_rows;
// softmax, log_softmax and their backward) against the CPU reference: the same
// public API on CPU tensors and on GPU copies of them, with fresh random
// inputs. Shapes reach every kernel path: one warp per row ([4096, 50]), one
// block per row ([37, 3000]) and rows split across blocks with a second pass
// ([1, 5M], [8, 300001]). Sums of small integers are exact, so they compare
// bit for bit, as do max and argmax; sums of normals compare with a tolerance
// that grows with the row length. The GPU must also give the same bits twice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}
Tensor cpu(const Tensor& t) {
  return t.to(kCpu);
}

std::string trace(DType dt, const Shape& shape, const std::string& what = "") {
  return std::string(dtype_name(dt)) + " " + shape_str(shape) + " " + what;
}

// The GPU sums in fp32 (f64 for f64) in a tree, the reference in f64 in order:
// allow a rounding of the accumulator per element summed, on top of the output
// dtype's own tolerance.
::testing::AssertionResult sums_close(const Tensor& actual, const Tensor& expected, int64_t terms) {
  const DType dt = actual.dtype();
  const double unit = dt == DType::f64 ? 1.1e-16 : 6e-8;
  return test::all_close(actual, expected, test::default_rtol(dt),
                         test::default_atol(dt) + 4.0 * unit * static_cast<double>(terms));
}

// Shapes [rows, cols] covering each path of reduce_last.
const Shape kRowShapes[] = {{4096, 50},  {3, 1024},    {5, 1025}, {37, 3000},
                            {8, 300001}, {1, 5000000}, {2, 1}};

// ---- reduce_last ----------------------------------------------------------------------

TEST(GpuReduce, sum_mean_max_argmax_over_the_last_dim_match_for_every_path) {
  ACCRUE_REQUIRE_CUDA();
  for (const Shape& shape : kRowShapes) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(trace(dt, shape));
      const Tensor a = test::random_normal(shape, dt);
      const Tensor g = gpu(a);
      EXPECT_TRUE(sums_close(cpu(kernels::sum(g, {1})), kernels::sum(a, {1}), shape[1]));
      EXPECT_TRUE(sums_close(cpu(kernels::mean(g, {1})), kernels::mean(a, {1}), 1));
      EXPECT_TRUE(test::all_equal(cpu(kernels::max(g, {1})), kernels::max(a, {1})));
      EXPECT_TRUE(test::all_equal(cpu(kernels::argmax(g, 1)), kernels::argmax(a, 1)));
    }
  }
}

TEST(GpuReduce, integer_sums_are_exact) {
  ACCRUE_REQUIRE_CUDA();
  for (const Shape& shape : kRowShapes) {
    for (DType dt : kFloatTypes) {
      // A row of 5M values in [-3, 3] can leave f16's range; the others cannot.
      if (dt == DType::f16 && shape[1] > 100000) continue;
      SCOPED_TRACE(trace(dt, shape));
      const Tensor a = test::random_integers(shape, -3, 3, dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::sum(gpu(a), {1})), kernels::sum(a, {1})));
    }
  }
}

TEST(GpuReduce, argmax_takes_the_first_of_tied_maxima) {
  ACCRUE_REQUIRE_CUDA();
  for (const Shape& shape : kRowShapes) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(trace(dt, shape));
      // Seven distinct values: every row's maximum appears many times.
      const Tensor a = test::random_integers(shape, -3, 3, dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::argmax(gpu(a), 1)), kernels::argmax(a, 1)));
      EXPECT_TRUE(test::all_equal(cpu(kernels::max(gpu(a), {1})), kernels::max(a, {1})));
    }
  }
  // Over the flattened tensor.
  const Tensor a = test::random_integers({300, 1001}, -3, 3, DType::f32);
  EXPECT_TRUE(test::all_equal(cpu(kernels::argmax(gpu(a))), kernels::argmax(a)));
}

TEST(GpuReduce, max_and_argmax_propagate_nan) {
  ACCRUE_REQUIRE_CUDA();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Shape& shape : {Shape{9, 40}, Shape{6, 3000}, Shape{2, 200000}}) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(trace(dt, shape));
      std::vector<double> v = test::random_normal(shape, DType::f64).to_vector<double>();
      const int64_t cols = shape[1];
      // Row 0: one NaN near the end; row 1: two NaNs (the first must win); others: none.
      v[static_cast<size_t>(cols - 2)] = nan;
      v[static_cast<size_t>(cols + cols / 3)] = nan;
      v[static_cast<size_t>(cols + cols / 2)] = nan;
      const Tensor a = from_vector(v, shape, dt);
      EXPECT_TRUE(test::all_equal(cpu(kernels::max(gpu(a), {1})), kernels::max(a, {1})));
      EXPECT_TRUE(test::all_equal(cpu(kernels::argmax(gpu(a), 1)), kernels::argmax(a, 1)));
    }
  }
}

TEST(GpuReduce, reductions_over_leading_and_several_dims) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = test::random_normal({300, 70}, dt);
    const Tensor b = test::random_normal({6, 5, 40}, dt);
    const Tensor ints = test::random_integers({6, 5, 40}, -3, 3, dt);
    EXPECT_TRUE(sums_close(cpu(kernels::sum(gpu(a), {0})), kernels::sum(a, {0}), 300));
    EXPECT_TRUE(test::all_equal(cpu(kernels::sum(gpu(ints), {0, 2})), kernels::sum(ints, {0, 2})));
    EXPECT_TRUE(
        test::all_equal(cpu(kernels::sum(gpu(ints), {}, true)), kernels::sum(ints, {}, true)));
    EXPECT_TRUE(sums_close(cpu(kernels::mean(gpu(b), {1}, true)), kernels::mean(b, {1}, true), 1));
    EXPECT_TRUE(sums_close(cpu(kernels::sum(gpu(a))), kernels::sum(a), a.numel()));
    EXPECT_TRUE(test::all_equal(cpu(kernels::max(gpu(a), {0})), kernels::max(a, {0})));
    EXPECT_TRUE(test::all_equal(cpu(kernels::argmax(gpu(b), 0)), kernels::argmax(b, 0)));
    EXPECT_TRUE(
        test::all_equal(cpu(kernels::argmax(gpu(b), 1, true)), kernels::argmax(b, 1, true)));
  }
}

TEST(GpuReduce, sums_are_bitwise_deterministic_and_independent_of_alignment) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{5000000}, int64_t{3001}, int64_t{777}}) {
      SCOPED_TRACE(trace(dt, {n}));
      // The same values twice: at an aligned address, and one element into a
      // buffer (a misaligned view that the kernel reads with scalar loads).
      const Tensor padded = gpu(test::random_normal({n + 1}, dt));
      const Tensor misaligned = padded.narrow(0, 1, n);
      const Tensor aligned = misaligned.clone();
      const Tensor first = cpu(kernels::sum(aligned));
      EXPECT_TRUE(test::all_equal(cpu(kernels::sum(aligned)), first));
      EXPECT_TRUE(test::all_equal(cpu(kernels::sum(misaligned)), first));
      // Rows of a matrix (the split scheme with several rows).
      const Tensor m = gpu(test::random_normal({4, n}, dt));
      EXPECT_TRUE(test::all_equal(cpu(kernels::sum(m, {1})), cpu(kernels::sum(m, {1}))));
    }
  }
}

// ---- sum_rows ---------------------------------------------------------------------------

struct SumRowsCase {
  DType in, out;
  int64_t n, d;
};

TEST(GpuSumRows, integer_column_sums_are_exact_when_writing_and_accumulating) {
  ACCRUE_REQUIRE_CUDA();
  // Linear's bias gradient ([tokens, features], bf16 into an fp32 slot) and
  // small or odd shapes (no split, widths that are not a multiple of a pack).
  // Up to 4,096 rows the sums run in one cluster on Hopper (Note [Column sums
  // in one cluster]: 1,024 x 2,304 is GPT-2 124M's qkv at micro-batch 1, 100
  // rows a cluster of 2); 4,097 rows take the two passes. The cluster blocks'
  // lanes follow the shape: 32 at 2,048 x 4,096, 16 at 4,096 x 2,304 and
  // 1,024 x 2,304, 8 at 4,096 x 768, 1,024 x 768 and 100 x 33, all in one
  // process (each lane count's kernel gets its own cluster attribute).
  const SumRowsCase cases[] = {
      {DType::bf16, DType::f32, 2048, 4096}, {DType::bf16, DType::f32, 4096, 2304},
      {DType::bf16, DType::f32, 4096, 768},  {DType::f32, DType::f32, 4096, 768},
      {DType::bf16, DType::f32, 16384, 768}, {DType::bf16, DType::f32, 16384, 3072},
      {DType::bf16, DType::f32, 1024, 2304}, {DType::bf16, DType::f32, 1024, 768},
      {DType::f32, DType::f32, 4097, 300},   {DType::f32, DType::f32, 16384, 768},
      {DType::f16, DType::f32, 4096, 1000},  {DType::f64, DType::f64, 5000, 129},
      {DType::bf16, DType::bf16, 3000, 768}, {DType::f16, DType::f16, 3000, 33},
      {DType::f32, DType::f32, 100, 33},     {DType::f32, DType::f32, 1, 5},
      {DType::f32, DType::f32, 20000, 1},
  };
  for (const SumRowsCase& c : cases) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(c.in)) + " -> " + dtype_name(c.out) + " " +
                   shape_str({c.n, c.d}) + (accumulate ? " accumulate" : " overwrite"));
      const Tensor in = test::random_integers({c.n, c.d}, -3, 3, c.in);
      Tensor expected = test::random_integers({c.d}, -50, 50, c.out);
      if (!accumulate) test::poison(expected);
      Tensor actual = gpu(expected);
      kernels::sum_rows_into(in, expected, accumulate);
      kernels::sum_rows_into(gpu(in), actual, accumulate);
      EXPECT_TRUE(test::all_equal(cpu(actual), expected));
    }
  }
}

// Note [Column sums in one cluster]: ACCRUE_SUM_ROWS_LANES forces a width;
// every width gives the exact sums, and a value other than 32, 16 or 8 throws.
TEST(GpuSumRows, forced_lanes_give_exact_sums_and_bad_values_throw) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor in = test::random_integers({4096, 768}, -3, 3, DType::bf16);
  Tensor expected = test::random_integers({768}, -50, 50, DType::f32);
  const Tensor start = gpu(expected);
  kernels::sum_rows_into(in, expected, /*accumulate=*/true);
  const Tensor g = gpu(in);
  struct Unset {  // whatever fails below, the later tests run without it
    ~Unset() { unsetenv("ACCRUE_SUM_ROWS_LANES"); }
  } unset;
  for (const char* lanes : {"32", "16", "8"}) {
    SCOPED_TRACE(std::string("lanes ") + lanes);
    ASSERT_EQ(setenv("ACCRUE_SUM_ROWS_LANES", lanes, 1), 0);
    Tensor actual = start.clone();
    kernels::sum_rows_into(g, actual, /*accumulate=*/true);
    EXPECT_TRUE(test::all_equal(cpu(actual), expected));
  }
  for (const char* bad : {"12", "0", "thirty-two"}) {
    ASSERT_EQ(setenv("ACCRUE_SUM_ROWS_LANES", bad, 1), 0);
    Tensor actual = start.clone();
    const std::string quoted = std::string("'") + bad + "'";
    EXPECT_ERROR(kernels::sum_rows_into(g, actual, true), "sum_rows", "ACCRUE_SUM_ROWS_LANES",
                 quoted.c_str());
  }
}

TEST(GpuSumRows, normal_column_sums_are_close_and_deterministic) {
  ACCRUE_REQUIRE_CUDA();
  const SumRowsCase cases[] = {{DType::bf16, DType::f32, 16384, 768},
                               {DType::bf16, DType::f32, 1024, 3072},
                               {DType::f32, DType::f32, 8192, 3072},
                               {DType::f64, DType::f64, 3000, 100},
                               {DType::bf16, DType::bf16, 2000, 513}};
  for (const SumRowsCase& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.in)) + " -> " + dtype_name(c.out) + " " +
                 shape_str({c.n, c.d}));
    const Tensor in = test::random_normal({c.n, c.d}, c.in);
    Tensor expected = empty({c.d}, c.out);
    kernels::sum_rows_into(in, expected, false);
    const Tensor g = gpu(in);
    Tensor first = empty({c.d}, c.out, kGpu), second = empty({c.d}, c.out, kGpu);
    test::poison(first);
    test::poison(second);
    kernels::sum_rows_into(g, first, false);
    kernels::sum_rows_into(g, second, false);
    EXPECT_TRUE(sums_close(cpu(first), expected, c.n));
    EXPECT_TRUE(test::all_equal(cpu(second), cpu(first)));
  }
}

// ---- softmax --------------------------------------------------------------------------------

const Shape kSoftmaxShapes[] = {{4096, 50}, {37, 3000}, {3, 50257}, {2, 1}};

TEST(GpuSoftmax, softmax_and_log_softmax_match_including_large_magnitudes) {
  ACCRUE_REQUIRE_CUDA();
  for (const Shape& shape : kSoftmaxShapes) {
    for (DType dt : kFloatTypes) {
      // Scale 1000: exp() would overflow without subtracting the row maximum.
      for (double scale : {1.0, 1000.0}) {
        SCOPED_TRACE(trace(dt, shape, "scale " + std::to_string(scale)));
        const Tensor a = test::random_normal(shape, dt, kCpu, scale);
        EXPECT_TRUE(test::all_close(cpu(kernels::softmax(gpu(a), 1)), kernels::softmax(a, 1)));
        EXPECT_TRUE(
            test::all_close(cpu(kernels::log_softmax(gpu(a), 1)), kernels::log_softmax(a, 1)));
      }
    }
  }
}

TEST(GpuSoftmax, masked_entries_and_leading_dims) {
  ACCRUE_REQUIRE_CUDA();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : kFloatTypes) {
    for (const Shape& shape : {Shape{64, 40}, Shape{5, 2000}}) {
      SCOPED_TRACE(trace(dt, shape));
      // -inf (a mask) at the start of every row and at every third entry: the
      // online maximum starts from -inf and must not turn it into NaN.
      std::vector<double> v = test::random_normal(shape, DType::f64).to_vector<double>();
      for (int64_t r = 0; r < shape[0]; ++r)
        for (int64_t c = 0; c < shape[1]; c += 3)
          v[static_cast<size_t>(r * shape[1] + c)] = -inf;
      const Tensor a = from_vector(v, shape, dt);
      EXPECT_TRUE(test::all_close(cpu(kernels::softmax(gpu(a), 1)), kernels::softmax(a, 1)));
      EXPECT_TRUE(
          test::all_close(cpu(kernels::log_softmax(gpu(a), 1)), kernels::log_softmax(a, 1)));
    }
    SCOPED_TRACE(trace(dt, {300, 20}, "dim 0"));
    const Tensor b = test::random_normal({300, 20}, dt);
    EXPECT_TRUE(test::all_close(cpu(kernels::softmax(gpu(b), 0)), kernels::softmax(b, 0)));
    EXPECT_TRUE(test::all_close(cpu(kernels::log_softmax(gpu(b), 0)), kernels::log_softmax(b, 0)));
  }
}

TEST(GpuSoftmax, backward_of_softmax_and_log_softmax_match) {
  ACCRUE_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{4096, 50}, Shape{37, 3000}, Shape{2, 40000}}) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(trace(dt, shape));
      const Tensor x = test::random_normal(shape, dt);
      const Tensor dy = test::random_normal(shape, dt);
      const Tensor y = kernels::softmax(x, 1);
      const Tensor log_y = kernels::log_softmax(x, 1);
      EXPECT_TRUE(test::all_close(cpu(kernels::softmax_backward(gpu(dy), gpu(y), 1)),
                                  kernels::softmax_backward(dy, y, 1)));
      EXPECT_TRUE(test::all_close(cpu(kernels::log_softmax_backward(gpu(dy), gpu(log_y), 1)),
                                  kernels::log_softmax_backward(dy, log_y, 1)));
    }
  }
}

}  // namespace
}  // namespace accrue
