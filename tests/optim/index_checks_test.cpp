// Note [Deferred index checks] on the CPU reference: the same cases as the
// CUDA tests (tests/optim/index_check_cases.h).
#include "tests/optim/index_check_cases.h"

namespace accrue {
namespace {

TEST(CpuDeferredIndexChecks, bad_embedding_index_skips_the_window) {
  test::bad_embedding_index_skips_the_window(Device::cpu());
}

TEST(CpuDeferredIndexChecks, first_fault_in_call_order_is_reported) {
  test::first_fault_in_call_order_is_reported(Device::cpu());
}

TEST(CpuDeferredIndexChecks, outside_a_window_the_check_is_eager) {
  test::outside_a_window_the_check_is_eager(Device::cpu());
}

// Two Windows on one thread: the innermost live one gets the faults, and
// destroying it hands them back to the outer one.
TEST(CpuDeferredIndexChecks, the_innermost_window_gets_the_faults) {
  test::TinyTokenModel outer(Device::cpu());
  const Tensor weight = test::random_normal({5, 2});
  const Tensor idx = from_vector<int64_t>({8}, {1});
  {
    test::TinyTokenModel inner(Device::cpu(), 12);
    kernels::embedding(weight, idx);
    EXPECT_NO_THROW(outer.window.check());
    EXPECT_ERROR(inner.window.check(), "embedding", "index 8");
  }
  kernels::embedding(weight, idx);
  EXPECT_ERROR(outer.window.check(), "embedding", "index 8");
}

}  // namespace
}  // namespace accrue
