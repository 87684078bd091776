// Note [Norm under the backward] on the CPU reference (the cases are shared
// with the CUDA test: tests/optim/norm_rows_cases.h).
#include "tests/optim/norm_rows_cases.h"

namespace accrue {
namespace {

TEST(CpuNormRows, rows_under_the_backward_match_a_close_time_pass) {
  test::norm_rows_under_the_backward_match_a_close_time_pass(Device::cpu());
}

// Row-range launches are the rows of one whole-table launch, bit for bit.
TEST(CpuNormRows, any_row_range_gives_the_rows_of_one_pass) {
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor g = test::random_normal({70001}, dt, Device::cpu(), 2.0);
    const int64_t rows = kernels::norm_partials_rows(g);
    ASSERT_GT(rows, 3);
    const Tensor whole = empty({rows, 2}, DType::f64), pieces = empty({rows, 2}, DType::f64);
    test::poison(pieces);
    kernels::grad_norm_partials(g, whole);
    kernels::grad_norm_partials(g, pieces, rows - 1, 1);
    kernels::grad_norm_partials(g, pieces, 1, rows - 2);
    kernels::grad_norm_partials(g, pieces, 0, 1);
    EXPECT_TRUE(test::all_equal(pieces, whole)) << dtype_name(dt);
    EXPECT_ERROR(kernels::grad_norm_partials(g, pieces, rows - 1, 2), "grad_norm_partials",
                 "rows [", "outside the");
  }
}

}  // namespace
}  // namespace accrue
