// Note [Fast division] and Note [Collapsed geometry] on the host: the magic
// division equals the plain one, and collapsing merges exactly what it may.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/collapsed_geometry.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(FastDivider, equals_plain_division_below_two_to_the_31) {
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 4096; ++d)
    divisors.push_back(d);
  for (int s = 12; s < 31; ++s)
    for (int64_t d : {(int64_t{1} << s) - 1, int64_t{1} << s, (int64_t{1} << s) + 1})
      divisors.push_back(d);
  divisors.push_back((int64_t{1} << 31) - 1);
  std::mt19937 rng(20261126);
  std::uniform_int_distribution<uint32_t> any(0, (uint32_t{1} << 31) - 1);
  for (int64_t d : divisors) {
    const FastDivider f(d);
    const uint32_t ud = static_cast<uint32_t>(d);
    std::vector<uint32_t> ns = {
        0, ud - 1, ud, ud + 1, (uint32_t{1} << 31) - 1, (uint32_t{1} << 31) - 1 - ud};
    for (int i = 0; i < 64; ++i)
      ns.push_back(any(rng));
    for (uint32_t n : ns) {
      if (n >= (uint32_t{1} << 31)) continue;
      ASSERT_EQ(f.div(n), n / ud) << n << " / " << d;
    }
  }
}

TEST(FastDivider, a_divisor_outside_the_range_is_an_error) {
  EXPECT_ERROR(FastDivider(0), "FastDivider", "divisor 0");
  EXPECT_ERROR(FastDivider(int64_t{1} << 31), "FastDivider", "2147483648");
}

TEST(CollapsedGeometry, merges_contiguous_dims_and_keeps_the_others) {
  // [8, 12, 1024, 1024] + [1024, 1024] broadcast: two dims, innermost first.
  const std::vector<int64_t> shape = {8, 12, 1024, 1024};
  const std::vector<int64_t> out = {12 * 1024 * 1024, 1024 * 1024, 1024, 1};
  const std::vector<int64_t> mask = {0, 0, 1024, 1};
  const CollapsedGeometry<2> g = collapse_geometry<2>(shape, {&out, &mask}, "test");
  ASSERT_EQ(g.rank, 2);
  EXPECT_EQ(g.sizes[0], 1024 * 1024);
  EXPECT_EQ(g.sizes[1], 96);
  EXPECT_EQ(g.strides[1][1], 0);
  EXPECT_TRUE(g.narrow);
  EXPECT_TRUE(rows_of_packs(g, 8));
  // A transpose stays rank 2 and is no rows of packs.
  const std::vector<int64_t> t_shape = {64, 1024};
  const std::vector<int64_t> dst = {1024, 1}, src = {1, 64};
  const CollapsedGeometry<2> t = collapse_geometry<2>(t_shape, {&dst, &src}, "test");
  EXPECT_EQ(t.rank, 2);
  EXPECT_FALSE(rows_of_packs(t, 4));
  const CollapsedGeometry<2> batch = t.without(0, 1);
  EXPECT_EQ(batch.rank, 0);
  EXPECT_EQ(batch.numel(), 1);
}

TEST(CollapsedGeometry, too_many_unmergeable_dims_is_an_error_naming_the_op) {
  std::vector<int64_t> shape(9, 2), a(9), b(9);
  for (int d = 0; d < 9; ++d) {
    a[d] = int64_t{1} << (8 - d);        // contiguous
    b[d] = int64_t{1} << (2 * (8 - d));  // every dim strided apart
  }
  EXPECT_ERROR((collapse_geometry<2>(shape, {&a, &b}, "copy")), "copy", "more than 8",
               "[2, 2, 2, 2, 2, 2, 2, 2, 2]");
}

}  // namespace
}  // namespace accrue
