// Gradients computed on the GPU equal the CPU reference's.
#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "accrue/nn/module.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

TEST(GpuAutograd, mlp_gradients_match_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  Generator g1(5), g2(5);
  nn::MLP cpu_model({16, 32, 8}, {Device::cpu(), DType::f32, &g1});
  nn::MLP gpu_model({16, 32, 8}, {Device::cuda(0), DType::f32, &g2});
  Tensor x = test::random_normal({64, 16});
  Tensor y = test::random_integers({64}, 0, 7, DType::i64);
  backward(cross_entropy(cpu_model.forward(x), y).sum / 64.0);
  backward(cross_entropy(gpu_model.forward(x.to(Device::cuda(0))), y.to(Device::cuda(0))).sum /
           64.0);
  const auto cp = cpu_model.named_parameters();
  const auto gp = gpu_model.named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i) {
    EXPECT_LT(test::relative_error(grad(gp[i].tensor), grad(cp[i].tensor)), 1e-5) << cp[i].name;
  }
}

// accrue::to_device carries the gradient across devices both ways, and
// Module::to(Device) moves parameters and buffers (Note [Module device and dtype]).
TEST(GpuAutograd, copies_across_devices_carry_the_gradient) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor x = requires_grad_(test::random_normal({5, 3}, DType::f64));
  const Tensor on_gpu = to_device(x, gpu);
  EXPECT_TRUE(on_gpu.requires_grad());
  EXPECT_ERROR(x.to(gpu), "Tensor::to(Device)", "accrue::to_device");
  backward(sum(to_device(on_gpu * 3.0, Device::cpu())));
  ASSERT_TRUE(grad(x).defined());
  EXPECT_EQ(grad(x).device(), Device::cpu());
  for (double g : grad(x).to_vector<double>())
    EXPECT_EQ(g, 3.0);
  const Tensor y = requires_grad_(test::random_normal({4}, DType::f32).to(gpu));
  backward(sum(clone(contiguous(to_dtype(y, DType::f64))) * 2.0));
  EXPECT_EQ(grad(y).device(), gpu);
  EXPECT_EQ(grad(y).dtype(), DType::f32);
  for (float g : grad(y).to_vector<float>())
    EXPECT_EQ(g, 2.0f);

  Generator g1(5), g2(5);
  nn::MLP cpu_model({16, 8}, {Device::cpu(), DType::f32, &g1});
  nn::MLP moved({16, 8}, {Device::cpu(), DType::f32, &g2});
  const Tensor weight = moved.named_parameters()[0].tensor;
  moved.to(gpu);
  EXPECT_EQ(weight.device(), gpu);  // the caller's handle sees the move
  const Tensor in = test::random_normal({4, 16});
  NoGradGuard no_grad;
  EXPECT_LT(test::relative_error(moved.forward(in.to(gpu)), cpu_model.forward(in)), 1e-6);
}

TEST(GpuAutograd, every_op_family_backward_matches_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  Tensor a = test::random_normal({6, 8}), w = test::random_normal({8}),
         b = test::random_normal({8});
  Tensor idx = from_vector<int64_t>({1, 3, 1, 0, 5, 1}, {6});
  Tensor table = test::random_normal({7, 8});
  auto loss = [&](Device d, Tensor& ga, Tensor& gw, Tensor& gt) {
    // detach(): on the CPU to() is the tensor itself, and the leaves must be
    // new ones each pass (a leaf that requires grad cannot be copied raw).
    Tensor la = requires_grad_(detach(a).to(d)), lw = requires_grad_(detach(w).to(d)), lb = b.to(d);
    Tensor lt = requires_grad_(detach(table).to(d));
    Tensor h = layer_norm(la + embedding(lt, idx.to(d)), lw, lb, 1e-5);
    h = gelu(h) * sigmoid(h) + tanh(h);
    Tensor s = softmax(h, 1) + log_softmax(h, 0) + max(h, {1}, true);
    backward(sum(s * s) + mean(matmul(h, transpose(h, 0, 1))));
    ga = grad(la).to(Device::cpu());
    gw = grad(lw).to(Device::cpu());
    gt = grad(lt).to(Device::cpu());
  };
  Tensor ca, cw, ct, ga, gw, gt;
  loss(Device::cpu(), ca, cw, ct);
  loss(gpu, ga, gw, gt);
  EXPECT_LT(test::relative_error(ga, ca), 1e-5);
  EXPECT_LT(test::relative_error(gw, cw), 1e-5);
  EXPECT_LT(test::relative_error(gt, ct), 1e-5);
}

}  // namespace
}  // namespace accrue
