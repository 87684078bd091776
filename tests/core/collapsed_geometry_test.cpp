// Note [Fast division] and Note [Collapsed geometry] on the host: the magic
// division equals the plain one, and collapsing merges exactly what it may.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "accrue/core/collapsed_geometry.h"
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

// Note [Rows of packs]: an input with stride 0 along the packs (a scalar, a
// per-row value) is a splat when the caller takes splats, and only then; the
// output never is.
TEST(CollapsedGeometry, rows_of_packs_take_splat_inputs_only_when_asked) {
  // masked_fill of [8, 12, 1024, 1024] scores: out, the [T, T] mask, the 0-d value.
  const std::vector<int64_t> shape = {8, 12, 1024, 1024};
  const std::vector<int64_t> out = {12 * 1024 * 1024, 1024 * 1024, 1024, 1};
  const std::vector<int64_t> mask = {0, 0, 1024, 1};
  const std::vector<int64_t> value = {0, 0, 0, 0};
  const CollapsedGeometry<4> g = collapse_geometry<4>(shape, {&out, &mask, &value, &out}, "test");
  EXPECT_FALSE(rows_of_packs(g, 8));
  uint32_t splats = 99;
  EXPECT_TRUE(rows_of_packs(g, 8, &splats));
  EXPECT_EQ(splats, 0b010u);  // input 1 (the value); inputs 0 and 2 are contiguous
  // A per-row value [R, 1] beside rows of 64: a splat whose row stride is 1.
  const std::vector<int64_t> rows = {16, 64}, dense = {64, 1}, per_row = {1, 0};
  const CollapsedGeometry<3> r = collapse_geometry<3>(rows, {&dense, &per_row, &dense}, "test");
  EXPECT_TRUE(rows_of_packs(r, 8, &splats));
  EXPECT_EQ(splats, 0b01u);
  // A broadcast output is never a splat; a ragged row is no rows of packs at all.
  const CollapsedGeometry<2> o = collapse_geometry<2>(rows, {&per_row, &dense}, "test");
  EXPECT_FALSE(rows_of_packs(o, 8, &splats));
  const std::vector<int64_t> ragged = {16, 60}, ragged_dense = {60, 1};
  const CollapsedGeometry<2> rg = collapse_geometry<2>(ragged, {&ragged_dense, &per_row}, "test");
  EXPECT_FALSE(rows_of_packs(rg, 8, &splats));
  EXPECT_EQ(splats, 0u);
}

// Every (output offset, input offset) pair the collapsed geometry's linear
// indices visit, in visiting order (the device's CollapsedGeometry::offsets,
// on the host).
std::vector<std::pair<int64_t, int64_t>> visited(const CollapsedGeometry<2>& g) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t linear = 0; linear < g.numel(); ++linear) {
    int64_t rest = linear, off[2] = {0, 0};
    for (int d = 0; d < g.rank; ++d) {
      const int64_t i = rest % g.sizes[d];
      rest /= g.sizes[d];
      for (int k = 0; k < 2; ++k)
        off[k] += i * g.strides[k][d];
    }
    out.emplace_back(off[0], off[1]);
  }
  return out;
}

// The same pairs from the logical row-major walk of the shape.
std::vector<std::pair<int64_t, int64_t>> logical(const std::vector<int64_t>& shape,
                                                 const std::vector<int64_t>& a,
                                                 const std::vector<int64_t>& b) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::vector<int64_t> index(shape.size(), 0);
  int64_t n = 1;
  for (int64_t s : shape)
    n *= s;
  for (int64_t i = 0; i < n; ++i) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      oa += index[d] * a[d];
      ob += index[d] * b[d];
    }
    out.emplace_back(oa, ob);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

// Row-major strides of `shape` laid out in the dim order `memory` (outermost first).
std::vector<int64_t> laid_out(const std::vector<int64_t>& shape, const std::vector<int>& memory) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (auto it = memory.rbegin(); it != memory.rend(); ++it) {
    strides[static_cast<size_t>(*it)] = step;
    step *= shape[static_cast<size_t>(*it)];
  }
  return strides;
}

// Note [Collapsed geometry]: the dims go in the output's memory order, so
// channels-last operands collapse to one contiguous dim (rows of packs) and
// a row-major output keeps the logical order; on random layouts (any dim
// order, broadcast and size-1 dims) the geometry pairs exactly the same
// output and input elements as the logical walk, and writes the output in
// memory order.
TEST(CollapsedGeometry, dims_follow_the_outputs_memory_order_and_pair_the_same_elements) {
  const std::vector<int64_t> nchw = {2, 8, 3, 5};
  const std::vector<int64_t> last = laid_out(nchw, {0, 2, 3, 1});
  const CollapsedGeometry<2> cl = collapse_geometry<2>(nchw, {&last, &last}, "test");
  ASSERT_EQ(cl.rank, 1);
  EXPECT_EQ(cl.sizes[0], 2 * 8 * 3 * 5);
  EXPECT_TRUE(rows_of_packs(cl, 8));
  // A channels-last output from a row-major input: the output's C innermost.
  const std::vector<int64_t> rows = laid_out(nchw, {0, 1, 2, 3});
  const CollapsedGeometry<2> to_last = collapse_geometry<2>(nchw, {&last, &rows}, "test");
  EXPECT_EQ(to_last.strides[0][0], 1);
  EXPECT_EQ(to_last.sizes[0], 8);

  std::mt19937 rng(20261127);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 5);
    std::vector<int64_t> shape(static_cast<size_t>(rank));
    for (int64_t& s : shape)
      s = 1 + static_cast<int64_t>(rng() % 4);
    std::vector<int> out_order(static_cast<size_t>(rank)), in_order(static_cast<size_t>(rank));
    std::iota(out_order.begin(), out_order.end(), 0);
    std::iota(in_order.begin(), in_order.end(), 0);
    std::shuffle(out_order.begin(), out_order.end(), rng);
    std::shuffle(in_order.begin(), in_order.end(), rng);
    const std::vector<int64_t> out = laid_out(shape, out_order);
    std::vector<int64_t> in = laid_out(shape, in_order);
    for (int64_t& stride : in)
      if (rng() % 4 == 0) stride = 0;  // broadcast
    SCOPED_TRACE("shape " + shape_str(shape) + " out " + shape_str(out) + " in " + shape_str(in));
    const CollapsedGeometry<2> g = collapse_geometry<2>(shape, {&out, &in}, "test");
    std::vector<std::pair<int64_t, int64_t>> got = visited(g), want = logical(shape, out, in);
    // The output is written in memory order: offsets 0, 1, 2, ...
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i].first, static_cast<int64_t>(i));
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(got, want);
  }
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
