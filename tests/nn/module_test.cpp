// Modules: parameter registration, shapes, initialization, and learning.
#include <cmath>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "core/grad_mode.h"
#include "kernels/ops.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(Modules, mlp_lists_parameters_in_registration_order) {
  Generator g(1);
  nn::MLP mlp({4, 8, 3}, {Device::cpu(), DType::f32, &g});
  const auto params = mlp.named_parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].name, "fc0.weight");
  EXPECT_EQ(params[1].name, "fc0.bias");
  EXPECT_EQ(params[2].name, "fc1.weight");
  EXPECT_EQ(params[0].tensor.shape(), (Shape{8, 4}));
  EXPECT_EQ(params[3].tensor.shape(), (Shape{3}));
  EXPECT_EQ(mlp.parameter_count(), 8 * 4 + 8 + 3 * 8 + 3);
  for (const auto& p : params)
    EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
}

TEST(Modules, linear_init_is_bounded_and_reproducible) {
  Generator g1(9), g2(9);
  nn::Linear a(100, 10, true, {Device::cpu(), DType::f32, &g1});
  nn::Linear b(100, 10, true, {Device::cpu(), DType::f32, &g2});
  EXPECT_TRUE(test::all_equal(a.weight(), b.weight()));
  for (float v : a.weight().to_vector<float>())
    EXPECT_LE(std::fabs(v), 0.1f);
}

TEST(Modules, linear_forward_matches_matmul_plus_bias) {
  Generator g(2);
  nn::Linear lin(3, 2, true, {Device::cpu(), DType::f64, &g});
  Tensor x = test::random_normal({4, 3}, DType::f64);
  NoGradGuard no_grad;
  Tensor expected = kernels::binary(kernels::BinaryOp::Add,
                                    kernels::matmul(x, lin.weight().transpose(0, 1)), lin.bias());
  EXPECT_TRUE(test::all_close(lin.forward(x), expected));
}

TEST(Modules, embedding_and_layer_norm_shapes) {
  Generator g(3);
  nn::Embedding emb(10, 4, {Device::cpu(), DType::f32, &g});
  nn::LayerNorm ln(4, {Device::cpu(), DType::f32, &g});
  Tensor idx = from_vector<int64_t>({1, 2, 3, 9, 0, 0}, {2, 3});
  Tensor h = ln.forward(emb.forward(idx));
  EXPECT_EQ(h.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(ln.named_parameters()[0].name, "weight");
  EXPECT_THROW(emb.forward(from_vector<int64_t>({10}, {1})), Error);
}

TEST(Modules, sgd_training_reduces_the_loss) {
  Generator g(4);
  nn::MLP mlp({8, 32, 4}, {Device::cpu(), DType::f32, &g});
  optim::PlainSGD sgd(mlp.parameters(), 0.2);
  Tensor x = test::random_normal({128, 8});
  Tensor y = kernels::argmax(kernels::matmul(x, test::random_normal({8, 4})), 1);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(mlp.forward(x), y).sum / 128.0;
    backward(loss);
    sgd.step();
    last = loss.item();
    if (step == 0) first = last;
  }
  EXPECT_LT(last, 0.5 * first);
  EXPECT_THROW(optim::PlainSGD(mlp.parameters(), -1.0), Error);
}

}  // namespace
}  // namespace accrue
