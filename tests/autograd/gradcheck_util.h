// What every gradcheck test file uses: a random f64 leaf and the check.
#pragma once

#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/variable.h"
#include "tests/test_util.h"

namespace accrue::test {

// A random normal f64 leaf that requires grad (entries scaled by `scale`).
inline Tensor leaf(const Shape& shape, double scale = 1.0) {
  return requires_grad_(random_normal(shape, DType::f64, Device::cpu(), scale));
}

}  // namespace accrue::test

// gradcheck(fn, {inputs...}) passes, or the test fails with its first mismatch.
#define EXPECT_GRADCHECK(fn, ...)                     \
  do {                                                \
    GradcheckResult r = gradcheck(fn, {__VA_ARGS__}); \
    EXPECT_TRUE(r.ok) << r.message;                   \
  } while (0)
