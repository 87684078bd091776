// The CPU indexing ops of kernels/indexing.h against independent host loops on
// fresh random inputs: small integers stored as floats, so every join, gather,
// scatter-add, cumsum and sort compares exactly. Then every error, and the
// deferred index checks (Note [Deferred index checks]).
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "accrue/core/parallel.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::all_equal;

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// Row-major multi-index <-> flat position over a shape.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    flat = flat * shape[d] + idx[d];
  return flat;
}

Tensor random_index(const Shape& shape, int64_t bound) {
  return test::random_integers(shape, 0, static_cast<int>(bound - 1), DType::i64);
}

Tensor host(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return from_vector<double>(v, shape, dtype);
}

// ---- cat / stack / split / chunk ------------------------------------------------------------

// cat by hand: walk the output and find the input each element comes from.
Tensor cat_reference(const std::vector<Tensor>& ts, int64_t d) {
  Shape shape = ts[0].shape();
  shape[d] = 0;
  for (const Tensor& t : ts)
    shape[d] += t.size(d);
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for (size_t j = 0; j < out.size(); ++j) {
    std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
    size_t which = 0;
    while (idx[d] >= ts[which].size(d)) {
      idx[d] -= ts[which].size(d);
      ++which;
    }
    out[j] = values(ts[which])[ravel(idx, ts[which].shape())];
  }
  return host(out, shape, ts[0].dtype());
}

TEST(CpuIndexing, cat_matches_a_reference_along_every_dim) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    for (int64_t d : {0, 1, 2, -1}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(d));
      const int64_t w = d < 0 ? d + 3 : d;
      std::vector<Tensor> ts;
      for (int64_t n : {2, 1, 3, 0}) {
        Shape s = {2, 3, 4};
        s[w] = n;
        ts.push_back(test::random_integers(s, -50, 50, dt));
      }
      EXPECT_TRUE(all_equal(kernels::cat(ts, d), cat_reference(ts, w)));
    }
  }
  // A strided input (a transpose) joins by its values, not its memory.
  const Tensor a = test::random_integers({4, 3}, -9, 9).transpose(0, 1);
  const Tensor b = test::random_integers({3, 2}, -9, 9);
  EXPECT_TRUE(all_equal(kernels::cat({a, b}, 1), cat_reference({a.contiguous(), b}, 1)));
}

TEST(CpuIndexing, stack_adds_a_dim) {
  const std::vector<Tensor> ts = {test::random_integers({2, 3}, -9, 9),
                                  test::random_integers({2, 3}, -9, 9),
                                  test::random_integers({2, 3}, -9, 9)};
  for (int64_t d : {0, 1, 2, -1}) {
    const int64_t w = d < 0 ? d + 3 : d;
    const Tensor out = kernels::stack(ts, d);
    Shape shape = {2, 3};
    shape.insert(shape.begin() + w, 3);
    ASSERT_EQ(out.shape(), shape);
    const std::vector<double> v = values(out);
    for (size_t j = 0; j < v.size(); ++j) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
      const int64_t which = idx[w];
      idx.erase(idx.begin() + w);
      EXPECT_EQ(v[j], values(ts[which])[ravel(idx, {2, 3})]);
    }
  }
}

TEST(CpuIndexing, split_and_chunk_are_views_with_pytorch_lengths) {
  const Tensor x = test::random_normal({3, 10});
  using V = std::vector<int64_t>;
  EXPECT_EQ(kernels::split_lengths(x, 4, 1), (V{4, 4, 2}));
  EXPECT_EQ(kernels::split_lengths(x, 10, 1), (V{10}));
  EXPECT_EQ(kernels::split_lengths(x, 20, 1), (V{10}));
  EXPECT_EQ(kernels::split_lengths(x, {3, 0, 7}, 1), (V{3, 0, 7}));
  EXPECT_EQ(kernels::split_lengths(x, {3}, 0), (V{3}));  // a braced list is the sizes
  EXPECT_EQ(kernels::chunk_lengths(x, 3, 1), (V{4, 4, 2}));
  EXPECT_EQ(kernels::chunk_lengths(x, 4, 1), (V{3, 3, 3, 1}));
  EXPECT_EQ(kernels::chunk_lengths(x, 6, 1), (V{2, 2, 2, 2, 2}));  // fewer pieces, as PyTorch
  EXPECT_EQ(kernels::chunk_lengths(x, 2, 0), (V{2, 1}));
  EXPECT_EQ(kernels::chunk_lengths(zeros({0, 2}), 3, 0), (V{0, 0, 0}));
  const std::vector<Tensor> pieces = kernels::split(x, {3, 0, 7}, -1);
  ASSERT_EQ(pieces.size(), 3u);
  int64_t at = 0;
  for (const Tensor& p : pieces) {
    EXPECT_EQ(p.storage(), x.storage());  // a view, not a copy
    EXPECT_TRUE(all_equal(p, x.narrow(1, at, p.size(1))));
    at += p.size(1);
  }
  const std::vector<Tensor> chunks = kernels::chunk(x, 2, 0);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_TRUE(all_equal(kernels::cat(chunks, 0), x));
}

TEST(CpuIndexing, repeat_interleave_and_its_backward) {
  for (int64_t d : {0, 1, 2}) {
    for (int64_t r : {1, 3, 0}) {
      SCOPED_TRACE("dim " + std::to_string(d) + " repeats " + std::to_string(r));
      const Tensor x = test::random_integers({2, 3, 2}, -9, 9, DType::f64);
      const Tensor out = kernels::repeat_interleave(x, r, d);
      Shape shape = x.shape();
      shape[d] *= r;
      ASSERT_EQ(out.shape(), shape);
      const std::vector<double> v = values(out), xv = values(x);
      for (size_t j = 0; j < v.size(); ++j) {
        std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
        idx[d] /= r;
        EXPECT_EQ(v[j], xv[ravel(idx, x.shape())]);
      }
      // Backward: each group of r slices summed.
      const Tensor g = test::random_integers(shape, -9, 9, DType::f64);
      const Tensor gx = kernels::repeat_interleave_backward(g, r, d, x.shape());
      std::vector<double> expected(xv.size(), 0.0);
      const std::vector<double> gv = values(g);
      for (size_t j = 0; j < gv.size(); ++j) {
        std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
        idx[d] /= r;
        expected[ravel(idx, x.shape())] += gv[j];
      }
      EXPECT_TRUE(all_equal(gx, host(expected, x.shape(), DType::f64)));
    }
  }
  // A 0-d input is one element.
  EXPECT_TRUE(all_equal(kernels::repeat_interleave(scalar_tensor(2.0), 3, 0), full({3}, 2.0)));
}

// ---- gathers and scatter-adds ---------------------------------------------------------------

TEST(CpuIndexing, gather_matches_a_reference) {
  for (int64_t d : {0, 1, 2, -1}) {
    for (DType dt : {DType::f32, DType::f16, DType::i64}) {
      const int64_t w = d < 0 ? d + 3 : d;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(d));
      const Tensor x = test::random_integers({3, 5, 4}, -50, 50, dt);
      Shape is = {2, 3, 3};  // smaller than x in the other dims
      is[w] = 6;             // and anything along dim
      const Tensor index = random_index(is, x.size(w));
      const Tensor out = kernels::gather(x, d, index);
      ASSERT_EQ(out.shape(), is);
      const std::vector<double> v = values(out), xv = values(x);
      const std::vector<int64_t> iv = index.to_vector<int64_t>();
      for (size_t j = 0; j < v.size(); ++j) {
        std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), is);
        idx[w] = iv[j];
        EXPECT_EQ(v[j], xv[ravel(idx, x.shape())]);
      }
    }
  }
  // A strided input.
  const Tensor x = test::random_normal({5, 3}).transpose(0, 1);
  const Tensor index = random_index({3, 4}, 5);
  EXPECT_TRUE(all_equal(kernels::gather(x, 1, index), kernels::gather(x.contiguous(), 1, index)));
}

// out = x; out[... index[j] ...] += alpha * src[j], by hand.
Tensor scatter_reference(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src,
                         double alpha) {
  std::vector<double> out = values(x);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  const Tensor used = [&] {
    Tensor u = src;
    for (int64_t e = 0; e < src.dim(); ++e)
      u = u.narrow(e, 0, index.size(e));
    return u;
  }();
  const std::vector<double> sv = values(used);
  for (size_t j = 0; j < iv.size(); ++j) {
    std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), index.shape());
    idx[d] = iv[j];
    out[ravel(idx, x.shape())] += alpha * sv[j];
  }
  return host(out, x.shape(), x.dtype());
}

TEST(CpuIndexing, scatter_add_sums_duplicates_like_a_reference) {
  for (int64_t d : {0, 1, 2}) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(d));
      const Tensor x = test::random_integers({3, 4, 5}, -9, 9, dt);
      Shape is = {3, 4, 5};
      is[d] = 7;  // more sources than destinations: duplicates for sure
      const Tensor index = random_index(is, x.size(d));
      const Tensor src = test::random_integers(is, -9, 9, dt);
      EXPECT_TRUE(all_equal(kernels::scatter_add(x, d, index, src),
                            scatter_reference(x, d, index, src, 1)));
      // src larger than the index: its extra elements are unused.
      Shape bigger = is;
      for (int64_t& s : bigger)
        s += 1;
      const Tensor big = test::random_integers(bigger, -9, 9, dt);
      const Tensor small_index = random_index({2, 2, 2}, std::min<int64_t>(x.size(d), 3));
      EXPECT_TRUE(all_equal(kernels::scatter_add(x, d, small_index, big),
                            scatter_reference(x, d, small_index, big, 1)));
    }
  }
}

TEST(CpuIndexing, integer_scatter_adds_count_exactly) {
  for (DType dt : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_integers({4, 5}, -9, 9, dt);
    const Tensor index = random_index({9, 5}, 4);
    const Tensor src = test::random_integers({9, 5}, -9, 9, dt);
    EXPECT_TRUE(
        all_equal(kernels::scatter_add(x, 0, index, src), scatter_reference(x, 0, index, src, 1)));
  }
  // MoE's tokens per expert: index_add of ones is a bincount.
  const Tensor expert = random_index({50}, 6);
  const Tensor counts =
      kernels::index_add(zeros({6}, DType::i64), 0, expert, ones({50}, DType::i64), 3.0);
  std::vector<double> expected(6, 0.0);
  for (int64_t e : expert.to_vector<int64_t>())
    expected[static_cast<size_t>(e)] += 3;
  EXPECT_EQ(counts.dtype(), DType::i64);
  EXPECT_EQ(values(counts), expected);
}

TEST(CpuIndexing, index_select_and_index_add_match_references) {
  for (int64_t d : {0, 1, -1}) {
    const int64_t w = d < 0 ? d + 3 : d;
    SCOPED_TRACE("dim " + std::to_string(d));
    const Tensor x = test::random_integers({4, 5, 3}, -9, 9, DType::f64);
    const Tensor index = random_index({7}, x.size(w));  // duplicates
    const Tensor out = kernels::index_select(x, d, index);
    Shape shape = x.shape();
    shape[w] = 7;
    ASSERT_EQ(out.shape(), shape);
    const std::vector<double> v = values(out), xv = values(x);
    const std::vector<int64_t> iv = index.to_vector<int64_t>();
    for (size_t j = 0; j < v.size(); ++j) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
      idx[w] = iv[idx[w]];
      EXPECT_EQ(v[j], xv[ravel(idx, x.shape())]);
    }
    // index_add with alpha: out = x; out.select(w, index[i]) += alpha * src.select(w, i).
    const Tensor src = test::random_integers(shape, -9, 9, DType::f64);
    const Tensor added = kernels::index_add(x, d, index, src, 2.0);
    std::vector<double> expected = xv;
    const std::vector<double> sv = values(src);
    for (size_t j = 0; j < sv.size(); ++j) {
      std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), shape);
      idx[w] = iv[idx[w]];
      expected[ravel(idx, x.shape())] += 2.0 * sv[j];
    }
    EXPECT_TRUE(all_equal(added, host(expected, x.shape(), DType::f64)));
  }
  // A 0-d index selects one slice and keeps the dim.
  const Tensor x = test::random_normal({3, 4});
  const Tensor one = kernels::index_select(x, 0, scalar_tensor(2, DType::i64));
  EXPECT_TRUE(all_equal(one, x.narrow(0, 2, 1)));
}

TEST(CpuIndexing, one_hot_matches_a_reference) {
  const Tensor index = random_index({3, 4}, 6);
  const Tensor out = kernels::one_hot(index, 6);
  ASSERT_EQ(out.shape(), (Shape{3, 4, 6}));
  EXPECT_EQ(out.dtype(), DType::i64);
  const std::vector<double> v = values(out);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (size_t j = 0; j < v.size(); ++j)
    EXPECT_EQ(v[j], iv[j / 6] == static_cast<int64_t>(j % 6) ? 1.0 : 0.0);
  const Tensor f = kernels::one_hot(from_vector<int64_t>({0, 4, 2}, {3}), -1, DType::f32);
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.shape(), (Shape{3, 5}));  // max + 1
  EXPECT_EQ(values(f.select(0, 1)), (std::vector<double>{0, 0, 0, 0, 1}));
}

// ---- cumsum, sort, topk -------------------------------------------------------------------

TEST(CpuIndexing, cumsum_matches_running_sums) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    for (int64_t d : {0, 1, 2}) {
      for (bool reverse : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(d) +
                     (reverse ? " reverse" : ""));
        const Tensor x = dt == DType::boolean ? test::random_integers({3, 4, 5}, 0, 1, dt)
                                              : test::random_integers({3, 4, 5}, -9, 9, dt);
        const Tensor out = kernels::cumsum(x, d, reverse);
        EXPECT_EQ(out.dtype(), is_floating(dt) ? dt : DType::i64);
        std::vector<double> expected = values(x);
        const int64_t n = x.size(d);
        for (size_t j = 0; j < expected.size(); ++j) {
          std::vector<int64_t> idx = unravel(static_cast<int64_t>(j), x.shape());
          const int64_t i = idx[d];
          double s = 0;
          for (int64_t k = reverse ? i : 0; k < (reverse ? n : i + 1); ++k) {
            idx[d] = k;
            s += values(x)[ravel(idx, x.shape())];
          }
          expected[j] = s;
        }
        EXPECT_TRUE(all_equal(out.to(DType::f64), host(expected, x.shape(), DType::f64)));
      }
    }
  }
}

// A stable sort by hand, NaN above every number.
std::vector<int64_t> order_of(const std::vector<double>& row, bool descending) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  const auto less = [](double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return descending ? less(row[b], row[a]) : less(row[a], row[b]);
  });
  return order;
}

TEST(CpuIndexing, sort_argsort_and_topk_are_stable_with_nan_last) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    for (bool descending : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (descending ? " descending" : ""));
      // Small integers: many ties. A NaN in some rows for the floats.
      Tensor x = test::random_integers({3, 4, 9}, -3, 3, DType::f64);
      if (is_floating(dt)) {
        std::vector<double> v = values(x);
        v[2] = v[40] = v[41] = std::numeric_limits<double>::quiet_NaN();
        x = host(v, x.shape(), DType::f64);
      }
      x = x.to(dt);
      for (int64_t d : {2, 1, 0}) {
        const SortResult r = kernels::sort(x, d, descending);
        const Tensor moved = x.transpose(d, 2).contiguous();
        const int64_t n = moved.size(2), rows = moved.numel() / n;
        const std::vector<double> mv = values(moved);
        std::vector<double> ev, ei;
        for (int64_t row = 0; row < rows; ++row) {
          std::vector<double> line(mv.begin() + row * n, mv.begin() + (row + 1) * n);
          for (int64_t i : order_of(line, descending)) {
            ev.push_back(line[i]);
            ei.push_back(static_cast<double>(i));
          }
        }
        const Tensor values_t = host(ev, moved.shape(), dt).transpose(d, 2);
        const Tensor index_t = host(ei, moved.shape(), DType::i64).transpose(d, 2);
        EXPECT_TRUE(all_equal(r.values, values_t)) << "dim " << d;
        EXPECT_TRUE(all_equal(r.indices, index_t)) << "dim " << d;
        EXPECT_TRUE(all_equal(kernels::argsort(x, d, descending), index_t));
        // topk: the first k of the sort (largest -> descending order).
        const SortResult t = kernels::topk(x, 2, d, descending);
        EXPECT_TRUE(all_equal(t.values, values_t.narrow(d, 0, 2)));
        EXPECT_TRUE(all_equal(t.indices, index_t.narrow(d, 0, 2)));
      }
    }
  }
  // k = 0 and 0-d inputs.
  EXPECT_EQ(kernels::topk(test::random_normal({3, 4}), 0).values.shape(), (Shape{3, 0}));
  const SortResult s = kernels::sort(scalar_tensor(5.0));
  EXPECT_EQ(s.values.item(), 5.0);
  EXPECT_EQ(s.indices.item(), 0.0);
}

// 0-d tensors, empty tensors and the extremes of each size argument.
TEST(CpuIndexing, edge_cases_follow_pytorch) {
  const Tensor s = scalar_tensor(3.0);
  EXPECT_EQ(kernels::cumsum(s, 0).item(), 3.0);
  EXPECT_EQ(kernels::cumsum(s, -1).shape(), Shape{});
  const Tensor zero = scalar_tensor(0, DType::i64);
  EXPECT_EQ(kernels::gather(s, 0, zero).item(), 3.0);
  EXPECT_EQ(kernels::scatter_add(s, 0, zero, scalar_tensor(2.0)).item(), 5.0);
  EXPECT_EQ(kernels::topk(s, 1).values.item(), 3.0);
  EXPECT_EQ(kernels::argsort(s).item(), 0.0);
  EXPECT_EQ(kernels::stack({s, s}, 0).shape(), (Shape{2}));
  EXPECT_EQ(kernels::one_hot(scalar_tensor(2, DType::i64), 4).shape(), (Shape{4}));
  // Empty inputs give empty outputs of the right shape.
  const Tensor empty_rows = zeros({0, 3});
  EXPECT_EQ(kernels::cat({empty_rows, empty_rows}, 0).shape(), (Shape{0, 3}));
  EXPECT_EQ(kernels::cumsum(empty_rows, 0).shape(), (Shape{0, 3}));
  EXPECT_EQ(kernels::sort(empty_rows, 0).values.shape(), (Shape{0, 3}));
  EXPECT_EQ(kernels::sort(zeros({3, 0}), 1).indices.shape(), (Shape{3, 0}));
  EXPECT_EQ(kernels::index_select(empty_rows, 1, zeros({0}, DType::i64)).shape(), (Shape{0, 0}));
  EXPECT_EQ(kernels::repeat_interleave(empty_rows, 4, 1).shape(), (Shape{0, 12}));
  // topk with k = n is the whole sort; more chunks than elements gives fewer pieces.
  const Tensor x = test::random_normal({2, 5});
  EXPECT_TRUE(all_equal(kernels::topk(x, 5, 1, false).values, kernels::sort(x, 1).values));
  EXPECT_EQ(kernels::chunk(x, 9, 1).size(), 5u);
  EXPECT_EQ(kernels::repeat_interleave(x, 2, -1).shape(), (Shape{2, 10}));
  // Sorting along a dim of size 1 is the identity.
  EXPECT_TRUE(all_equal(kernels::sort(x, 0).values.narrow(0, 0, 2), kernels::sort(x, 0).values));
  EXPECT_TRUE(all_equal(kernels::sort(x.unsqueeze(2), 2).values, x.unsqueeze(2)));
}

// Note [CPU threads]: the split kernels give the same bits on 1 and 4 threads.
TEST(CpuIndexing, results_do_not_depend_on_the_thread_count) {
  const int before = num_threads();
  const Tensor x = test::random_normal({64, 3000});
  const Tensor index = random_index({64, 3000}, 3000);
  const auto run = [&](int threads) {
    set_num_threads(threads);
    const SortResult s = kernels::sort(x, 1, true);
    return std::vector<Tensor>{kernels::gather(x, 1, index),
                               kernels::cumsum(x, 1),
                               kernels::cumsum(x, 0),
                               s.values,
                               s.indices,
                               kernels::topk(x, 5, 0).indices};
  };
  const std::vector<Tensor> one = run(1);
  const int64_t runs = parallel_runs();
  const std::vector<Tensor> four = run(4);
  set_num_threads(before);
  EXPECT_GT(parallel_runs(), runs);  // the pool was used
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_TRUE(all_equal(four[i], one[i])) << "result " << i;
}

// ---- errors ---------------------------------------------------------------------------------

TEST(CpuIndexing, bad_inputs_throw_naming_the_op_and_values) {
  const Tensor x = test::random_normal({2, 3});
  EXPECT_ERROR(kernels::cat({}, 0), "cat", "empty list");
  EXPECT_ERROR(kernels::cat({x, x.to(DType::f64)}, 0), "cat", "f32", "f64", "convert tensor 1");
  EXPECT_ERROR(kernels::cat({x, test::random_normal({2, 4})}, 0), "cat", "tensor 1", "[2, 4]",
               "dim 1", "4 vs 3");
  EXPECT_ERROR(kernels::cat({x, test::random_normal({2})}, 0), "cat", "tensor 1", "1 dims");
  EXPECT_ERROR(kernels::cat({x, x}, 2), "cat", "dim 2");
  EXPECT_ERROR(kernels::cat({scalar_tensor(1.0)}, 0), "cat", "0-d");
  EXPECT_ERROR(kernels::cat({x, Tensor()}, 0), "cat", "tensor 1", "undefined");
  EXPECT_ERROR(kernels::stack({x, test::random_normal({3, 2})}, 0), "stack", "tensor 1", "[3, 2]");
  EXPECT_ERROR(kernels::stack({x}, 3), "stack", "dim 3");
  EXPECT_ERROR(kernels::split(x, 0, 1), "split", "split size 0");
  EXPECT_ERROR(kernels::split(x, -2, 1), "split", "-2");
  EXPECT_ERROR(kernels::split(x, {1, 1}, 1), "split", "[1, 1]", "add up to 2", "3");
  EXPECT_ERROR(kernels::split(x, {4, -1}, 1), "split", "[4, -1]");
  EXPECT_ERROR(kernels::split(x, 1, 2), "split", "dim 2");
  EXPECT_ERROR(kernels::chunk(x, 0, 1), "chunk", "chunks = 0");
  EXPECT_ERROR(kernels::repeat_interleave(x, -1, 0), "repeat_interleave", "repeats = -1");
  EXPECT_ERROR(kernels::repeat_interleave(x, 2, 2), "repeat_interleave", "dim 2");

  const Tensor idx = from_vector<int64_t>({0, 2, 1, 0, 1, 2}, {2, 3});
  EXPECT_ERROR(kernels::gather(x, 0, idx.to(DType::i32)), "gather", "index", "i32", "i64");
  EXPECT_ERROR(kernels::gather(x, 0, idx.reshape({6})), "gather", "[6]", "[2, 3]", "dims");
  EXPECT_ERROR(kernels::gather(x, 0, from_vector<int64_t>({0, 1, 0, 1}, {1, 4})), "gather", "dim 1",
               "4 > 3");
  EXPECT_ERROR(kernels::gather(x, 0, idx), "gather", "index 2", "[0, 2)");
  EXPECT_ERROR(kernels::gather(x, 1, from_vector<int64_t>({0, -1}, {2, 1})), "gather", "index -1",
               "[0, 3)");
  EXPECT_ERROR(kernels::gather(x, 3, idx), "gather", "dim 3");
  EXPECT_ERROR(kernels::scatter_add(x, 1, idx, x.to(DType::f64)), "scatter_add", "f32", "f64",
               "src");
  EXPECT_ERROR(kernels::scatter_add(x, 1, idx, test::random_normal({2, 2})), "scatter_add", "src",
               "dim 1", "3 > 2");
  EXPECT_ERROR(kernels::scatter_add(x, 1, from_vector<int64_t>({5}, {1, 1}), x), "scatter_add",
               "index 5", "[0, 3)");
  const Tensor flags = full({2, 3}, 1.0, DType::boolean);
  EXPECT_ERROR(kernels::scatter_add(flags, 1, idx, flags), "scatter_add", "bool",
               "floating dtype, i32 or i64");
  EXPECT_ERROR(kernels::index_add(zeros({3}, DType::i64), 0, from_vector<int64_t>({0, 1}, {2}),
                                  zeros({2}, DType::i64), 0.5),
               "index_add", "alpha = 0.5", "whole number", "i64");
  const Tensor row = from_vector<int64_t>({0, 1}, {2});
  EXPECT_ERROR(kernels::index_select(x, 1, idx), "index_select", "[2, 3]", "1-D");
  EXPECT_ERROR(kernels::index_select(x, 1, from_vector<int64_t>({3}, {1})), "index_select",
               "index 3", "[0, 3)");
  EXPECT_ERROR(kernels::index_select(x, 1, row.to(DType::f32)), "index_select", "f32", "i64");
  EXPECT_ERROR(kernels::index_add(x, 1, row, test::random_normal({2, 3})), "index_add", "[2, 3]",
               "expected [2, 2]");
  EXPECT_ERROR(kernels::index_add(x, 0, row, x.to(DType::bf16)), "index_add", "bf16", "f32");
  EXPECT_ERROR(kernels::index_add(x, 0, from_vector<int64_t>({0, 7}, {2}), x), "index_add",
               "index 7", "[0, 2)");
  EXPECT_ERROR(kernels::one_hot(row, 1), "one_hot", "index 1", "[0, 1)");
  EXPECT_ERROR(kernels::one_hot(row, -2), "one_hot", "num_classes = -2");
  EXPECT_ERROR(kernels::one_hot(zeros({0}, DType::i64)), "one_hot", "empty");
  EXPECT_ERROR(kernels::one_hot(row.to(DType::i32), 3), "one_hot", "i32", "i64");
  EXPECT_ERROR(kernels::cumsum(x, 2), "cumsum", "dim 2");
  EXPECT_ERROR(kernels::sort(x, -3), "sort", "dim -3");
  EXPECT_ERROR(kernels::topk(x, 4, 1), "topk", "k = 4", "[0, 3]");
  EXPECT_ERROR(kernels::topk(x, -1), "topk", "k = -1");
  EXPECT_ERROR(kernels::argsort(Tensor()), "argsort", "undefined");
}

// Note [Deferred index checks]: with a live DeferredIndexChecks the bad index
// is only recorded (items becomes NaN), the kernels stay in bounds, and the
// error comes from raise_pending naming the op and the value.
TEST(CpuIndexing, bad_indices_are_deferred_while_a_window_checks_them) {
  const Tensor items = full({1}, 3.0, DType::f64);
  kernels::DeferredIndexChecks checks(Device::cpu(), items);
  const Tensor x = test::random_integers({2, 3}, -9, 9);
  const Tensor bad = from_vector<int64_t>({0, 5, 1}, {1, 3});
  const Tensor g = kernels::gather(x, 0, bad);
  EXPECT_TRUE(std::isnan(values(g)[1]));
  EXPECT_EQ(values(g)[0], values(x)[0]);
  EXPECT_TRUE(std::isnan(items.item()));
  EXPECT_ERROR(checks.raise_pending(), "gather", "index 5", "[0, 2)");
  // A dropped scatter: the other sources still land.
  items.fill_(3.0);
  const Tensor s = kernels::scatter_add(x, 0, bad, full({1, 3}, 1.0));
  EXPECT_EQ(values(s)[0], values(x)[0] + 1.0);
  EXPECT_EQ(values(s)[5], values(x)[5] + 1.0);
  EXPECT_EQ(values(s)[1], values(x)[1]);
  EXPECT_ERROR(checks.raise_pending(), "scatter_add", "index 5");
  const Tensor oh = kernels::one_hot(from_vector<int64_t>({1, 9}, {2}), 3);
  EXPECT_EQ(values(oh), (std::vector<double>{0, 1, 0, 0, 0, 0}));
  EXPECT_ERROR(checks.raise_pending(), "one_hot", "index 9", "[0, 3)");
}

}  // namespace
}  // namespace accrue
