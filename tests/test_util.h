// Helpers shared by the tests: GPU skipping, random inputs, comparisons with
// tolerances set by dtype.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/random.h"
#include "accrue/core/tensor.h"

namespace accrue::test {

// Note [NVTX ranges]: what one range adds to nvtx_ranges_pushed() while the
// ranges are on; without CUDA nothing is ever pushed.
#ifdef ACCRUE_WITH_CUDA
inline constexpr int64_t kNvtxPushedWhenOn = 1;
#else
inline constexpr int64_t kNvtxPushedWhenOn = 0;
#endif

// Skips the current test, with the reason, when no CUDA device can be used.
#define ACCRUE_REQUIRE_CUDA()                                                      \
  do {                                                                             \
    if (!::accrue::cuda_available())                                               \
      GTEST_SKIP() << "needs a CUDA GPU: " << ::accrue::cuda_unavailable_reason(); \
  } while (0)

// Expects `statement` to throw accrue::Error whose message contains every fragment
// (the op's name and the offending values, as every error must).
#define EXPECT_ERROR(statement, ...)                              \
  do {                                                            \
    try {                                                         \
      statement;                                                  \
      ADD_FAILURE() << "expected accrue::Error from " #statement; \
    } catch (const ::accrue::Error& e) {                          \
      for (const char* part : {__VA_ARGS__})                      \
        EXPECT_THAT(e.what(), ::testing::HasSubstr(part));        \
    }                                                             \
  } while (0)

// Fresh random inputs: normal(0, 1) scaled, never zeros. Each call draws new numbers.
Tensor random_normal(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                     double scale = 1.0);
// Uniform on [lo, hi).
Tensor random_uniform(const Shape& shape, double lo, double hi, DType dtype = DType::f32,
                      Device device = Device::cpu());
// Small integers in [lo, hi] stored in a float dtype: sums and products of a few
// of them are exact, so results compare with equality.
Tensor random_integers(const Shape& shape, int lo, int hi, DType dtype = DType::f32,
                       Device device = Device::cpu());
// Powers of two 2^e, e in [lo, hi], f32: scales whose products with small
// integers stay exact (FP8 tile scales in exact GEMM tests).
Tensor random_powers_of_two(const Shape& shape, int lo, int hi, Device device = Device::cpu());

// Relative tolerance for results computed in `dtype` (fp32 math for 16-bit types).
double default_rtol(DType dtype);
double default_atol(DType dtype);
// The normalized error ||gpu - cpu|| / ||cpu|| allowed for a result stored in
// `dtype` and accumulated in fp32 (f64 for f64): one rounding to the dtype.
double normalized_tolerance(DType dtype);

// Elementwise |actual - expected| <= atol + rtol * |expected|, NaN never passes
// (unless both are NaN at the same place). Compares values as f64 on the host;
// on failure reports the worst element, its index and both values.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol);
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected);
// Bitwise-equal values (after conversion to f64) and equal shapes.
::testing::AssertionResult all_equal(const Tensor& actual, const Tensor& expected);

// ||a - b|| / ||b|| over all elements, in f64.
double relative_error(const Tensor& a, const Tensor& b);
// relative_error(actual, expected) <= tol, saying both when not (any devices and dtypes).
::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, double tol);

// Sets whether f32 GEMMs may use TF32 for a scope and restores it at exit, so
// a failing test leaves the setting as it found it.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allow);
  ~Tf32Scope();
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool previous_;
};

// The same for kernels::set_check_indices.
class CheckIndicesScope {
 public:
  explicit CheckIndicesScope(bool check);
  ~CheckIndicesScope();
  CheckIndicesScope(const CheckIndicesScope&) = delete;
  CheckIndicesScope& operator=(const CheckIndicesScope&) = delete;

 private:
  bool previous_;
};

// CUDA graphs need the stream-ordered pool (Note [Capturable code]); the
// compute-sanitizer runs set the plain allocator for every test
// (ACCRUE_TEST_ALLOCATOR=plain), so a test that captures holds this scope.
class GraphPoolScope {
 public:
  GraphPoolScope();
  ~GraphPoolScope();
  GraphPoolScope(const GraphPoolScope&) = delete;
  GraphPoolScope& operator=(const GraphPoolScope&) = delete;

 private:
  CudaAllocatorMode previous_;
};

// Poisons a tensor's memory with NaN (floats) or a sentinel (ints), so that an
// element a kernel forgot to write shows up in the comparison.
void poison(const Tensor& t);

// [N, C, H, W] t's values in a fresh channels-last buffer (memory N, H, W, C),
// viewed as [N, C, H, W].
Tensor as_channels_last(const Tensor& t);

}  // namespace accrue::test
