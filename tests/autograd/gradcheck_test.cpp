// Every differentiable op passes a float64 central-difference gradcheck on the CPU.
#include "accrue/autograd/gradcheck.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/node.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/statistics_sync.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

using test::leaf;

Tensor positive_leaf(const Shape& shape) {
  return requires_grad_(test::random_uniform(shape, 0.5, 2.0, DType::f64));
}

TEST(Gradcheck, binary_ops_with_broadcasting) {
  for (auto op : std::vector<Fn>{
           [](auto& v) { return add(v[0], v[1]); }, [](auto& v) { return sub(v[0], v[1]); },
           [](auto& v) { return mul(v[0], v[1]); }, [](auto& v) { return div(v[0], v[1]); }}) {
    EXPECT_GRADCHECK(op, leaf({3, 4}), positive_leaf({3, 4}));
    EXPECT_GRADCHECK(op, leaf({3, 1}), positive_leaf({4}));    // both broadcast
    EXPECT_GRADCHECK(op, leaf({2, 3, 4}), positive_leaf({}));  // 0-d operand
  }
}

TEST(Gradcheck, scalar_ops) {
  EXPECT_GRADCHECK([](auto& v) { return v[0] + 2.0; }, leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return v[0] * -3.0; }, leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return v[0] / 4.0; }, leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return 1.5 - v[0]; }, leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return 2.0 / v[0]; }, positive_leaf({5}));
}

TEST(Gradcheck, unary_ops) {
  EXPECT_GRADCHECK([](auto& v) { return neg(v[0]); }, leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return exp(v[0]); }, leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return log(v[0]); }, positive_leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return sqrt(v[0]); }, positive_leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return tanh(v[0]); }, leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return gelu(v[0]); }, leaf({7}, 2.0));
  EXPECT_GRADCHECK([](auto& v) { return sigmoid(v[0]); }, leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return pow(v[0], 3.0); }, leaf({7}));
  EXPECT_GRADCHECK([](auto& v) { return pow(v[0], -1.5); }, positive_leaf({7}));
  // relu is not differentiable at 0; random inputs are away from it.
  EXPECT_GRADCHECK([](auto& v) { return relu(v[0]); }, leaf({7}));
}

TEST(Gradcheck, where_routes_gradients_by_the_mask) {
  Tensor cond = kernels::compare(kernels::CompareOp::Gt, test::random_normal({4, 5}, DType::f64),
                                 zeros({}, DType::f64));
  EXPECT_GRADCHECK([cond](auto& v) { return where(cond, v[0], v[1]); }, leaf({4, 5}), leaf({5}));
}

TEST(Gradcheck, reductions) {
  EXPECT_GRADCHECK([](auto& v) { return sum(v[0]); }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return sum(v[0], {1}); }, leaf({3, 4, 2}));
  EXPECT_GRADCHECK([](auto& v) { return sum(v[0], {0, -1}, true); }, leaf({3, 4, 2}));
  EXPECT_GRADCHECK([](auto& v) { return mean(v[0]); }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return mean(v[0], {0}); }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return max(v[0], {1}); }, leaf({3, 6}));
  EXPECT_GRADCHECK([](auto& v) { return max(v[0]); }, leaf({3, 6}));
  EXPECT_GRADCHECK([](auto& v) { return softmax(v[0], 1); }, leaf({3, 5}));
  EXPECT_GRADCHECK([](auto& v) { return softmax(v[0], 0); }, leaf({3, 5}));
  EXPECT_GRADCHECK([](auto& v) { return log_softmax(v[0], -1); }, leaf({3, 5}));
  EXPECT_GRADCHECK([](auto& v) { return log_softmax(v[0], 0); }, leaf({4, 2, 3}));
}

TEST(Gradcheck, shape_ops) {
  EXPECT_GRADCHECK([](auto& v) { return view(v[0], {6, 2}) * 2.0; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return reshape(transpose(v[0], 0, 1), {-1}); }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return permute(v[0], {2, 0, 1}) * 1.0; }, leaf({2, 3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return narrow(v[0], 1, 1, 2) * 1.0; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return select(v[0], 0, 2) * 1.0; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return squeeze(unsqueeze(v[0], 1), 1) * 1.0; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return expand(v[0], {2, 3, 4}) * 1.0; }, leaf({3, 1}));
  EXPECT_GRADCHECK([](auto& v) { return contiguous(transpose(v[0], 0, 1)); }, leaf({3, 4}));
}

TEST(Gradcheck, matmul_in_every_rank) {
  auto mm = [](auto& v) { return matmul(v[0], v[1]); };
  EXPECT_GRADCHECK(mm, leaf({3, 4}), leaf({4, 5}));
  EXPECT_GRADCHECK(mm, leaf({4}), leaf({4, 5}));
  EXPECT_GRADCHECK(mm, leaf({3, 4}), leaf({4}));
  EXPECT_GRADCHECK(mm, leaf({4}), leaf({4}));
  EXPECT_GRADCHECK(mm, leaf({2, 3, 4}), leaf({2, 4, 5}));
  EXPECT_GRADCHECK(mm, leaf({2, 3, 4}), leaf({4, 5}));  // broadcast batch
  EXPECT_GRADCHECK([](auto& v) { return matmul(transpose(v[0], 0, 1), v[1]); }, leaf({4, 3}),
                   leaf({4, 2}));
}

TEST(Gradcheck, linear_with_and_without_bias) {
  EXPECT_GRADCHECK([](auto& v) { return linear(v[0], v[1], v[2]); }, leaf({2, 3, 4}), leaf({5, 4}),
                   leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return linear(v[0], v[1], Tensor()); }, leaf({3, 4}),
                   leaf({5, 4}));
}

TEST(Gradcheck, embedding_with_repeated_indices) {
  Tensor idx = from_vector<int64_t>({2, 0, 2, 3, 2}, {5});
  EXPECT_GRADCHECK([idx](auto& v) { return embedding(v[0], idx); }, leaf({4, 3}));
  Tensor idx2 = from_vector<int32_t>({1, 1, 0, 3}, {2, 2});
  EXPECT_GRADCHECK([idx2](auto& v) { return embedding(v[0], idx2); }, leaf({4, 3}));
}

TEST(Gradcheck, cross_entropy_sum_with_ignored_targets) {
  Tensor targets = from_vector<int64_t>({1, -100, 4, 0, 2}, {5});
  EXPECT_GRADCHECK([targets](auto& v) { return cross_entropy(v[0], targets).sum; },
                   leaf({5, 6}, 2.0));
}

TEST(Gradcheck, layer_norm_with_affine_parameters) {
  EXPECT_GRADCHECK([](auto& v) { return layer_norm(v[0], v[1], v[2], 1e-5); }, leaf({4, 6}),
                   leaf({6}), leaf({6}));
  EXPECT_GRADCHECK([](auto& v) { return layer_norm(v[0], Tensor(), Tensor(), 1e-5); },
                   leaf({2, 3, 5}));
}

TEST(Gradcheck, a_composite_mlp_loss) {
  Tensor targets = from_vector<int64_t>({0, 2, 1}, {3});
  EXPECT_GRADCHECK(
      [targets](auto& v) {
        Tensor h = gelu(linear(v[0], v[1], v[2]));
        return cross_entropy(layer_norm(h, Tensor(), Tensor(), 1e-5), targets).sum;
      },
      leaf({3, 4}), leaf({3, 4}), leaf({3}));
}

TEST(Gradcheck, detects_a_wrong_gradient) {
  // A function whose recorded backward is deliberately wrong must fail the check.
  auto wrong = [](const std::vector<Tensor>& v) {
    return autograd::record("WrongBackward", kernels::unary(kernels::UnaryOp::Exp, v[0]), {v[0]},
                            [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  };
  EXPECT_FALSE(gradcheck(wrong, {leaf({3})}).ok);
}

// all_reduce_sum over a world of two identical ranks (this rank's value,
// twice): forward 2x, and the backward sums the gradient the same way.
TEST(Gradcheck, all_reduce_sum_over_identical_ranks) {
  struct Twice : StatisticsSync {
    void all_reduce_sum(const Tensor& t) override { t.copy_(t.clone() * 2.0); }
    int world_size() const override { return 2; }
  } twice;
  EXPECT_GRADCHECK([&twice](auto& v) { return all_reduce_sum(v[0] * v[0], twice); }, leaf({2, 3}));
}

}  // namespace
}  // namespace accrue
