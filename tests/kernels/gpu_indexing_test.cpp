// The CUDA indexing ops against the CPU reference (Note [Indexing ops]): the
// same public calls on CPU tensors and on GPU copies. Joins, gathers and sorts
// move values, and sums of small integers are exact in every float dtype, so
// those compare bit for bit; random-normal scatter-adds and running sums are
// compared by a tolerance and run twice to show the GPU gives the same bits.
#include <gmock/gmock.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/kernels/index_checks.h"
#include "accrue/kernels/indexing.h"
#include "accrue/kernels/ops.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::all_equal;
using test::close;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

Tensor on_cpu(const Tensor& t) {
  return t.to(kCpu);
}

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}

Tensor random_index(const Shape& shape, int64_t bound) {
  return test::random_integers(shape, 0, static_cast<int>(bound - 1), DType::i64);
}

std::string trace(DType dt, int64_t dim) {
  return std::string(dtype_name(dt)) + " dim " + std::to_string(dim);
}

TEST(GpuIndexing, cat_stack_split_and_repeat_interleave_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (int64_t d : {0, 1, 2}) {
      SCOPED_TRACE(trace(dt, d));
      std::vector<Tensor> ts, ts_gpu;
      for (int64_t n : {3, 1, 0, 17}) {
        Shape s = {4, 6, 5};
        s[d] = n;
        ts.push_back(test::random_integers(s, -50, 50, dt));
        ts_gpu.push_back(gpu(ts.back()));
      }
      EXPECT_TRUE(all_equal(on_cpu(kernels::cat(ts_gpu, d)), kernels::cat(ts, d)));
      const std::vector<Tensor> same = {ts[0], ts[0], ts[0]};
      const std::vector<Tensor> same_gpu = {ts_gpu[0], ts_gpu[0], ts_gpu[0]};
      EXPECT_TRUE(all_equal(on_cpu(kernels::stack(same_gpu, d)), kernels::stack(same, d)));
      const Tensor x = test::random_integers({4, 6, 5}, -50, 50, dt);
      const std::vector<Tensor> pieces = kernels::chunk(gpu(x), 4, d);
      EXPECT_TRUE(all_equal(on_cpu(kernels::cat(pieces, d)), x));
      EXPECT_TRUE(all_equal(on_cpu(kernels::repeat_interleave(gpu(x), 3, d)),
                            kernels::repeat_interleave(x, 3, d)));
    }
  }
}

TEST(GpuIndexing, gather_and_index_select_match_cpu_exactly) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64}) {
    for (int64_t d : {0, 1, 2}) {
      SCOPED_TRACE(trace(dt, d));
      const Tensor x = test::random_normal({9, 33, 7}, DType::f64).to(dt);
      Shape is = {5, 20, 7};
      is[d] = 40;
      const Tensor index = random_index(is, x.size(d));
      EXPECT_TRUE(
          all_equal(on_cpu(kernels::gather(gpu(x), d, gpu(index))), kernels::gather(x, d, index)));
      const Tensor sel = random_index({50}, x.size(d));
      EXPECT_TRUE(all_equal(on_cpu(kernels::index_select(gpu(x), d, gpu(sel))),
                            kernels::index_select(x, d, sel)));
      // A strided input.
      const Tensor xt = gpu(x).transpose(0, 2);
      const Tensor it = random_index({3, 10, 4}, xt.size(1));
      EXPECT_TRUE(all_equal(on_cpu(kernels::gather(xt, 1, gpu(it))),
                            kernels::gather(x.transpose(0, 2), 1, it)));
      // A strided index (its dims reversed in memory).
      const Tensor raw = random_index({is[2], is[1], is[0]}, x.size(d));
      EXPECT_TRUE(all_equal(on_cpu(kernels::gather(gpu(x), d, gpu(raw).transpose(0, 2))),
                            kernels::gather(x, d, raw.transpose(0, 2))));
    }
  }
}

// Rows of at least a warp take the row path (one block per output row); an
// index that varies in other dims, or rows that are not contiguous, do not.
TEST(GpuIndexing, row_gathers_match_cpu_exactly) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor table = test::random_normal({500, 1024}, DType::f64).to(dt);
    std::vector<int64_t> v = random_index({300}, 500).to_vector<int64_t>();
    const Tensor idx = from_vector(v, {300});
    EXPECT_TRUE(all_equal(on_cpu(kernels::index_select(gpu(table), 0, gpu(idx))),
                          kernels::index_select(table, 0, idx)));
    // Rows inside a larger tensor: [4, 50, 3, 40] along dim 1, outer dims strided.
    const Tensor x = test::random_normal({4, 50, 3, 40}, DType::f64).to(dt);
    const Tensor sel = random_index({70}, 50);
    EXPECT_TRUE(all_equal(on_cpu(kernels::index_select(gpu(x), 1, gpu(sel))),
                          kernels::index_select(x, 1, sel)));
    const Tensor xs = gpu(x).narrow(0, 1, 2);  // an offset view
    EXPECT_TRUE(all_equal(on_cpu(kernels::index_select(xs, 1, gpu(sel))),
                          kernels::index_select(x.narrow(0, 1, 2), 1, sel)));
    // A gather whose index is expanded over the row dims takes the row path too.
    const Tensor rows = gpu(sel).view({1, 70, 1, 1}).expand({4, 70, 3, 40});
    EXPECT_TRUE(
        all_equal(on_cpu(kernels::gather(gpu(x), 1, rows)), kernels::index_select(x, 1, sel)));
  }
}

TEST(GpuIndexing, scatter_add_and_index_add_sum_small_integers_exactly) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (int64_t d : {0, 1, 2}) {
      SCOPED_TRACE(trace(dt, d));
      const Tensor x = test::random_integers({6, 10, 5}, -20, 20, dt);
      Shape is = {6, 10, 5};
      is[d] = 40;  // many sources per destination
      const Tensor index = random_index(is, x.size(d));
      const Tensor src = test::random_integers(is, -3, 3, dt);
      EXPECT_TRUE(all_equal(on_cpu(kernels::scatter_add(gpu(x), d, gpu(index), gpu(src))),
                            kernels::scatter_add(x, d, index, src)));
      const Tensor idx = random_index({40}, x.size(d));
      EXPECT_TRUE(all_equal(on_cpu(kernels::index_add(gpu(x), d, gpu(idx), gpu(src), 2.0)),
                            kernels::index_add(x, d, idx, src, 2.0)));
    }
  }
}

// Whole rows added (index_add, an index expanded over the row dims) sort only
// the indices: the same sums as the CPU's, bit for bit on small integers.
TEST(GpuIndexing, row_scatter_adds_match_cpu_exactly) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_integers({4, 50, 3, 40}, -20, 20, dt);
    const Tensor sel = random_index({90}, 50);  // repeated rows
    const Tensor src = test::random_integers({4, 90, 3, 40}, -3, 3, dt);
    EXPECT_TRUE(all_equal(on_cpu(kernels::index_add(gpu(x), 1, gpu(sel), gpu(src), 2.0)),
                          kernels::index_add(x, 1, sel, src, 2.0)));
    // An expanded index smaller than x in an outer dim: strided outer rows.
    const Tensor small = random_index({12}, 50);
    const Tensor idx = small.view({1, 12, 1, 1}).expand({3, 12, 3, 40});
    const Tensor part = test::random_integers({3, 12, 3, 40}, -3, 3, dt);
    const Tensor idx_gpu = gpu(small).view({1, 12, 1, 1}).expand({3, 12, 3, 40});
    EXPECT_TRUE(all_equal(on_cpu(kernels::scatter_add(gpu(x), 1, idx_gpu, gpu(part))),
                          kernels::scatter_add(x, 1, idx, part)));
    // The same index made dense takes the general path: the same result.
    EXPECT_TRUE(all_equal(on_cpu(kernels::scatter_add(gpu(x), 1, gpu(idx), gpu(part))),
                          kernels::scatter_add(x, 1, idx, part)));
  }
}

TEST(GpuIndexing, integer_scatter_adds_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_integers({30, 8}, -100, 100, dt);
    const Tensor index = random_index({500, 8}, 30);
    const Tensor src = test::random_integers({500, 8}, -100, 100, dt);
    EXPECT_TRUE(all_equal(on_cpu(kernels::scatter_add(gpu(x), 0, gpu(index), gpu(src))),
                          kernels::scatter_add(x, 0, index, src)));
    const Tensor expert = random_index({1000}, 8);
    const Tensor ones_ = ones({1000}, dt);
    EXPECT_TRUE(all_equal(
        on_cpu(kernels::index_add(zeros({8}, dt, kGpu), 0, gpu(expert), gpu(ones_), -2.0)),
        kernels::index_add(zeros({8}, dt), 0, expert, ones_, -2.0)));
  }
}

TEST(GpuIndexing, scatter_add_is_deterministic_on_random_values) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // A hot destination (a third of the sources) as MoE routing or padding makes.
    std::vector<int64_t> v = random_index({20000}, 300).to_vector<int64_t>();
    for (size_t i = 0; i < v.size(); i += 3)
      v[i] = 7;
    const Tensor idx = from_vector(v, {20000});
    const Tensor x = test::random_normal({300, 64}, dt);
    const Tensor src = test::random_normal({20000, 64}, dt);
    const Tensor first = kernels::index_add(gpu(x), 0, gpu(idx), gpu(src));
    const Tensor second = kernels::index_add(gpu(x), 0, gpu(idx), gpu(src));
    EXPECT_TRUE(all_equal(on_cpu(first), on_cpu(second)));
    EXPECT_TRUE(
        close(on_cpu(first), kernels::index_add(x, 0, idx, src), test::normalized_tolerance(dt)));
  }
}

TEST(GpuIndexing, one_hot_and_cumsum_match_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor index = random_index({7, 9}, 11);
  for (DType dt : {DType::i64, DType::f32, DType::bf16, DType::boolean})
    EXPECT_TRUE(
        all_equal(on_cpu(kernels::one_hot(gpu(index), 11, dt)), kernels::one_hot(index, 11, dt)));
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::boolean}) {
    for (int64_t d : {0, 1, 2}) {
      for (bool reverse : {false, true}) {
        SCOPED_TRACE(trace(dt, d) + (reverse ? " reverse" : ""));
        const Tensor x = dt == DType::boolean ? test::random_integers({5, 300, 3}, 0, 1, dt)
                                              : test::random_integers({5, 300, 3}, -3, 3, dt);
        EXPECT_TRUE(
            all_equal(on_cpu(kernels::cumsum(gpu(x), d, reverse)), kernels::cumsum(x, d, reverse)));
      }
    }
  }
  // Random values: one rounding per running sum in fp32 (f64 for f64).
  for (DType dt : kFloatTypes) {
    const Tensor x = test::random_normal({4, 1000}, dt);
    const Tensor first = kernels::cumsum(gpu(x), 1);
    EXPECT_TRUE(all_equal(on_cpu(first), on_cpu(kernels::cumsum(gpu(x), 1))));
    EXPECT_TRUE(close(on_cpu(first), kernels::cumsum(x, 1), 4 * test::normalized_tolerance(dt)));
  }
}

TEST(GpuIndexing, sort_argsort_and_topk_equal_cpu_with_ties_and_nan) {
  ACCRUE_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::i32}) {
    for (int64_t n : std::vector<int64_t>{1, 7, 64, 1000, kernels::kMaxCudaSortRow,
                                          kernels::kMaxCudaSortRow + 1, 70000}) {
      for (bool descending : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) +
                     (descending ? " descending" : ""));
        Tensor x = test::random_integers({3, n}, -20, 20, DType::f64);  // many ties
        if (is_floating(dt)) {
          std::vector<double> v = x.to_vector<double>();
          v[0] = std::numeric_limits<double>::quiet_NaN();
          v[v.size() - 1] = std::numeric_limits<double>::quiet_NaN();
          x = from_vector<double>(v, x.shape());
        }
        x = x.to(dt);
        const SortResult expected = kernels::sort(x, 1, descending);
        const SortResult actual = kernels::sort(gpu(x), 1, descending);
        EXPECT_TRUE(all_equal(on_cpu(actual.values), expected.values));
        EXPECT_TRUE(all_equal(on_cpu(actual.indices), expected.indices));
        EXPECT_TRUE(all_equal(on_cpu(kernels::argsort(gpu(x), 1, descending)), expected.indices));
        const int64_t k = std::min<int64_t>(n, 5);
        const SortResult top = kernels::topk(gpu(x), k, 1, descending);
        EXPECT_TRUE(all_equal(on_cpu(top.values), expected.values.narrow(1, 0, k)));
        EXPECT_TRUE(all_equal(on_cpu(top.indices), expected.indices.narrow(1, 0, k)));
      }
    }
  }
  // Along a dim that is not last.
  const Tensor x = test::random_normal({40, 6});
  EXPECT_TRUE(all_equal(on_cpu(kernels::sort(gpu(x), 0).values), kernels::sort(x, 0).values));
}

TEST(GpuIndexing, errors_name_the_op_and_values) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor x = test::random_normal({2, 3}, DType::f32, kGpu);
  EXPECT_ERROR(kernels::cat({x, x.to(kCpu)}, 0), "cat", "tensor 1", "cpu");
  EXPECT_ERROR(kernels::gather(x, 1, from_vector<int64_t>({0, 3}, {1, 2}, DType::i64, kGpu)),
               "gather", "index 3", "[0, 3)");
  EXPECT_ERROR(kernels::index_select(x, 1, from_vector<int64_t>({1}, {1})), "index_select", "index",
               "cpu");
}

// Note [Capturable code]: with the eager index checks off (they read a count
// back; a Window defers them instead), the ops record into a CUDA graph whose
// replay on new inputs equals the eager calls.
TEST(GpuIndexing, the_ops_capture_into_a_cuda_graph) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  test::CheckIndicesScope no_checks(false);
  const Tensor x = gpu(test::random_normal({64, 32}));
  const Tensor src = gpu(test::random_normal({100, 32}));
  const Tensor idx = gpu(random_index({100}, 64));
  const auto ops = [&] {
    const Tensor a = kernels::index_add(x, 0, idx, src);
    const Tensor b = kernels::cumsum(kernels::index_select(a, 0, idx), 1);
    const SortResult top = kernels::topk(b, 5, 1);
    return kernels::cat({top.values, kernels::gather(b, 1, top.indices)}, 1);
  };
  const Tensor warm = ops();  // a first eager run, as every capture wants
  const Tensor result = empty(warm.shape(), DType::f32, kGpu);
  std::string why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(
      0, [&] { result.copy_(ops()); }, &why);
  ASSERT_TRUE(graph) << why;
  x.copy_(test::random_normal({64, 32}));  // new values in the captured buffers
  graph->launch();
  EXPECT_TRUE(all_equal(on_cpu(result), on_cpu(ops())));
  EXPECT_FALSE(all_equal(on_cpu(result), on_cpu(warm)));
}

// Note [Deferred index checks] on CUDA: recorded without a synchronization,
// raised by the host's next read, the kernels in bounds meanwhile.
TEST(GpuIndexing, bad_indices_are_deferred_on_the_device) {
  ACCRUE_REQUIRE_CUDA();
  const Tensor items = full({1}, 3.0, DType::f64, kGpu);
  kernels::DeferredIndexChecks checks(kGpu, items);
  const Tensor x = test::random_integers({2, 3}, -9, 9, DType::f32, kGpu);
  const Tensor bad = from_vector<int64_t>({0, 5, 1}, {1, 3}, DType::i64, kGpu);
  const std::vector<double> g = kernels::gather(x, 0, bad).to_vector<double>();
  EXPECT_TRUE(std::isnan(g[1]));
  EXPECT_TRUE(std::isnan(items.item()));
  EXPECT_ERROR(checks.raise_pending(), "gather", "index 5", "[0, 2)");
  const Tensor s = kernels::scatter_add(x, 0, bad, full({1, 3}, 1.0, DType::f32, kGpu));
  // The bad source is dropped; the others land.
  const std::vector<double> sv = s.to_vector<double>(), xv = x.to_vector<double>();
  EXPECT_EQ(sv[0], xv[0] + 1);
  EXPECT_EQ(sv[1], xv[1]);
  EXPECT_EQ(sv[5], xv[5] + 1);
  EXPECT_ERROR(checks.raise_pending(), "scatter_add", "index 5");
}

}  // namespace
}  // namespace accrue
