// A whole ResNet on the GPU (Note [Composed convolution]: conv, max and
// adaptive pooling; BatchNorm from the composed ops) against the same network
// on the CPU: the loss and every parameter's gradient, f32 with TF32 off.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/ops.h"
#include "accrue/nn/resnet.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

struct Result {
  double loss = 0.0;
  std::vector<Tensor> grads;  // on the CPU
};

Result run(const nn::ResNetConfig& config, Device device, const Tensor& x, const Tensor& y) {
  Generator gen(5);  // the same weights on both devices (drawn on the CPU)
  nn::ResNet model(config, {device, DType::f32, &gen});
  const Loss loss = cross_entropy(model.forward(x.to(device)), y.to(device));
  backward(loss.sum);
  Result r;
  r.loss = loss.sum.item();
  for (const Tensor& p : model.parameters())
    r.grads.push_back(grad(p).to(Device::cpu()));
  return r;
}

TEST(GpuResNet, a_resnet_trains_on_the_gpu_as_on_the_cpu) {
  ACCRUE_REQUIRE_CUDA();
  const bool tf32 = kernels::allow_tf32();
  kernels::set_allow_tf32(false);
  nn::ResNetConfig c;
  c.bottleneck = true;
  c.blocks = {1, 1};
  c.width = 4;
  c.num_classes = 5;
  c.small_input = false;  // the 7x7 stride-2 stem and the 3x3 max pool
  const Tensor x = test::random_normal({3, 3, 32, 32}, DType::f32);
  Generator labels(2);
  const Tensor y = randint(0, 5, {3}, DType::i64, Device::cpu(), &labels);
  const Result cpu = run(c, Device::cpu(), x, y), gpu = run(c, kGpu, x, y);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-4 * std::abs(cpu.loss));
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    EXPECT_LE(test::relative_error(gpu.grads[i], cpu.grads[i]), 1e-3) << "parameter " << i;
  kernels::set_allow_tf32(tf32);
}

}  // namespace
}  // namespace accrue
