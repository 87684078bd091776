// The differentiable indexing ops of autograd/indexing_ops.h pass the float64
// finite-difference gradcheck, and the integer-valued ones record nothing.
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/indexing_ops.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/optim/index_check_cases.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::leaf;

Tensor index_tensor(const Shape& shape, int64_t bound) {
  return test::random_integers(shape, 0, static_cast<int>(bound - 1), DType::i64);
}

// ---- joining and splitting ------------------------------------------------------------------

TEST(IndexingGradcheck, cat_and_stack) {
  for (int64_t d : {0, 1, -1}) {
    auto f = [d](const std::vector<Tensor>& v) { return cat({v[0], v[1], v[2]}, d); };
    Shape a = {2, 3}, b = {2, 3}, c = {2, 3};
    const int64_t w = d < 0 ? 1 : d;
    a[w] = 1;
    c[w] = 4;
    EXPECT_GRADCHECK(f, leaf(a), leaf(b), leaf(c));
  }
  // An input that needs no gradient sits between two that do.
  const Tensor constant = test::random_normal({2, 2}, DType::f64);
  auto g = [&](const std::vector<Tensor>& v) { return cat({v[0], constant, v[1]}, 1); };
  EXPECT_GRADCHECK(g, leaf({2, 3}), leaf({2, 1}));
  // One tensor joined twice: both slices' gradients reach it.
  auto twice = [](const std::vector<Tensor>& v) { return cat({v[0], mul(v[0], 2.0), v[0]}, 0); };
  EXPECT_GRADCHECK(twice, leaf({2, 3}));
  auto stacked_twice = [](const std::vector<Tensor>& v) { return stack({v[0], v[0]}, 1); };
  EXPECT_GRADCHECK(stacked_twice, leaf({2, 3}));
  for (int64_t d : {0, 1, 2, -1}) {
    auto s = [d](const std::vector<Tensor>& v) { return stack({v[0], v[1]}, d); };
    EXPECT_GRADCHECK(s, leaf({3, 2}), leaf({3, 2}));
  }
}

TEST(IndexingGradcheck, split_and_chunk_pieces) {
  // The pieces, each used differently, joined back in another order.
  auto f = [](const std::vector<Tensor>& v) {
    const std::vector<Tensor> p = split(v[0], {1, 3, 2}, 1);
    return cat({mul(p[2], 3.0), exp(p[0]), p[1]}, 1);
  };
  EXPECT_GRADCHECK(f, leaf({2, 6}));
  auto g = [](const std::vector<Tensor>& v) {
    const std::vector<Tensor> p = chunk(v[0], 3, 0);  // 3, 3, 1 rows
    return add(sum(mul(p[0], p[1])), sum(exp(p[2])));
  };
  EXPECT_GRADCHECK(g, leaf({7, 2}));
  auto u = [](const std::vector<Tensor>& v) {
    const std::vector<Tensor> s = unbind(v[0], 1);  // 3 slices of [2, 4]
    return add(mul(s[0], s[2]), exp(s[1]));
  };
  EXPECT_GRADCHECK(u, leaf({2, 3, 4}));
  EXPECT_EQ(unbind(leaf({2, 3}), -1).size(), 3u);
  EXPECT_ERROR(unbind(leaf({2}), 1), "unbind", "dim 1");
  EXPECT_ERROR(unbind(scalar_tensor(1.0)), "unbind", "0-d");
  // Only some pieces used: the others' region gets zero.
  auto h = [](const std::vector<Tensor>& v) { return split(v[0], 2, -1)[1]; };
  EXPECT_GRADCHECK(h, leaf({3, 5}));
}

TEST(IndexingGradcheck, repeat_interleave_sums_each_group) {
  for (int64_t d : {0, 1, 2}) {
    auto f = [d](const std::vector<Tensor>& v) { return repeat_interleave(v[0], 3, d); };
    EXPECT_GRADCHECK(f, leaf({2, 3, 2}));
  }
  // GQA's use: kv heads [B, Hkv, T, D] repeated to the query heads.
  auto gqa = [](const std::vector<Tensor>& v) {
    return matmul(v[0], transpose(repeat_interleave(v[1], 2, 1), 2, 3));
  };
  EXPECT_GRADCHECK(gqa, leaf({1, 4, 3, 2}), leaf({1, 2, 3, 2}));
}

// ---- gathers and scatter-adds ---------------------------------------------------------------

TEST(IndexingGradcheck, gather_and_scatter_add) {
  for (int64_t d : {0, 1, 2}) {
    Shape is = {2, 3, 2};
    is[d] = 5;  // repeated indices: the gather's gradient adds them up
    const Shape xs = {3, 4, 3};
    const Tensor index = index_tensor(is, xs[d]);
    auto g = [&](const std::vector<Tensor>& v) { return gather(v[0], d, index); };
    EXPECT_GRADCHECK(g, leaf(xs));
    auto s = [&](const std::vector<Tensor>& v) { return scatter_add(v[0], d, index, v[1]); };
    EXPECT_GRADCHECK(s, leaf(xs), leaf(is));
    // src larger than the index: its unused elements get zero.
    Shape bigger = is;
    bigger[0] += 1;
    EXPECT_GRADCHECK(s, leaf(xs), leaf(bigger));
  }
}

TEST(IndexingGradcheck, index_select_and_index_add) {
  for (int64_t d : {0, 1, -1}) {
    const Tensor index = index_tensor({6}, 3);
    auto sel = [&](const std::vector<Tensor>& v) { return index_select(v[0], d, index); };
    EXPECT_GRADCHECK(sel, leaf({3, 3, 3}));
    auto add = [&](const std::vector<Tensor>& v) { return index_add(v[0], d, index, v[1], -1.5); };
    Shape src = {3, 3, 3};
    src[d < 0 ? 2 : d] = 6;
    EXPECT_GRADCHECK(add, leaf({3, 3, 3}), leaf(src));
  }
}

// ---- scans and orderings --------------------------------------------------------------------

TEST(IndexingGradcheck, cumsum_along_every_dim) {
  for (int64_t d : {0, 1, 2, -1}) {
    auto f = [d](const std::vector<Tensor>& v) { return cumsum(v[0], d); };
    EXPECT_GRADCHECK(f, leaf({3, 4, 2}));
  }
}

TEST(IndexingGradcheck, sort_and_topk_values) {
  for (int64_t d : {0, 1, -1}) {
    for (bool flag : {false, true}) {
      auto s = [=](const std::vector<Tensor>& v) { return sort(v[0], d, flag).values; };
      EXPECT_GRADCHECK(s, leaf({4, 5}));
      auto t = [=](const std::vector<Tensor>& v) { return topk(v[0], 2, d, flag).values; };
      EXPECT_GRADCHECK(t, leaf({4, 5}));
    }
  }
}

TEST(IndexingGradcheck, integer_results_record_nothing) {
  const Tensor x = leaf({3, 4});
  EXPECT_FALSE(argmax(x, 1).requires_grad());
  EXPECT_FALSE(argsort(x, 1).requires_grad());
  EXPECT_FALSE(sort(x).indices.requires_grad());
  EXPECT_TRUE(sort(x).values.requires_grad());
  EXPECT_FALSE(topk(x, 2).indices.requires_grad());
  EXPECT_FALSE(one_hot(index_tensor({3}, 4), 4).requires_grad());
  EXPECT_EQ(argmax(x, 1).dtype(), DType::i64);
  // A backward through a topk lands only on the chosen positions.
  const SortResult t = topk(x, 1, 1);
  backward(sum(t.values));
  const std::vector<int64_t> chosen = t.indices.to_vector<int64_t>();
  const std::vector<double> g = grad(x).to_vector<double>();
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(g[r * 4 + c], c == chosen[r] ? 1.0 : 0.0);
}

// ---- inside a Window ------------------------------------------------------------------------

// A model that routes through the indexing ops trains in a Window; a bad index
// there is deferred (Note [Deferred index checks]): the call does not throw,
// the window is skipped with its weights bitwise unchanged, and report() names
// the op and the value.
TEST(IndexingInWindow, trains_through_the_ops_and_defers_a_bad_index) {
  test::TinyTokenModel m(Device::cpu());
  const Tensor y = m.targets({0, 1, 2, 0, 1, 2});
  auto micro_step = [&](std::vector<int64_t> tokens) {
    const Tensor rows = index_select(m.embedding.weight(), 0, from_vector<int64_t>(tokens, {6}));
    const SortResult top = topk(rows, 2, 1);  // [6, 2] each
    const Tensor features = cat({cumsum(top.values, 1), gather(rows, 1, top.indices)}, 1);
    m.window.backward(cross_entropy(m.linear.forward(features), y));
  };
  const Tensor before = m.arena.master().clone();
  micro_step({0, 1, 2, 3, 4, 5});
  micro_step({5, 5, 6, 0, 1, 1});
  m.window.close();
  const optim::WindowReport first = m.window.report();
  EXPECT_FALSE(first.skipped);
  EXPECT_EQ(first.optimizer_steps, 1);
  EXPECT_FALSE(test::all_equal(m.arena.master(), before));

  const Tensor stepped = m.arena.master().clone();
  micro_step({0, 1, 2, 3, 4, 5});
  EXPECT_NO_THROW(micro_step({0, 1, 9, 3, 4, 5}));
  m.window.close();
  EXPECT_TRUE(test::all_equal(m.arena.master(), stepped));
  EXPECT_ERROR(m.window.report(), "index_select", "index 9", "flat position 2",
               "out of range [0, 7)", "window 1", "micro-step 1", "skipped");
}

}  // namespace
}  // namespace accrue
