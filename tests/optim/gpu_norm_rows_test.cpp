// Note [Norm under the backward] on CUDA: the CPU's cases
// (tests/optim/norm_rows_cases.h).
#include "tests/optim/norm_rows_cases.h"

namespace accrue {
namespace {

TEST(GpuNormRows, rows_under_the_backward_match_a_close_time_pass) {
  ACCRUE_REQUIRE_CUDA();
  test::norm_rows_under_the_backward_match_a_close_time_pass(Device::cuda(0));
}

TEST(GpuNormRows, any_row_range_gives_the_rows_of_one_pass) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor g = test::random_normal({3000003}, dt, Device::cuda(0), 2.0);
    const int64_t rows = kernels::norm_partials_rows(g);
    ASSERT_GT(rows, 3);
    const Tensor whole = empty({rows, 2}, DType::f64, Device::cuda(0));
    const Tensor pieces = empty({rows, 2}, DType::f64, Device::cuda(0));
    kernels::grad_norm_partials(g, whole);
    kernels::grad_norm_partials(g, pieces, rows - 1, 1);
    kernels::grad_norm_partials(g, pieces, 1, rows - 2);
    kernels::grad_norm_partials(g, pieces, 0, 1);
    EXPECT_TRUE(test::all_equal(pieces.to(Device::cpu()), whole.to(Device::cpu())))
        << dtype_name(dt);
  }
}

}  // namespace
}  // namespace accrue
