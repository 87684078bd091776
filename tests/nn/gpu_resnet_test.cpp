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
#include "accrue/optim/graphed_window.h"
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

// Note [Graphed window] with BatchNorm's window statistics (Note [Window
// statistics]): a small bf16 ResNet on channels-last inputs, its micro-steps
// and closes replayed from graphs, ends with the eager run's weights, momenta,
// running statistics and reports, bit for bit; also with the convolutions' and
// the classifier's weight gradients on a side stream (Note [Weight gradients
// on a branch], lags 1 and 2), and with two micro-batches in flight, their
// BatchNorm statistics ordered (Note [Concurrent micro-batches]).
nn::ResNet& channels_last(nn::ResNet& model) {
  model.to_channels_last();  // as accrue_resnet_bench --channels-last
  return model;
}

struct GraphedResNet {
  Generator gen{5};
  nn::ResNet model;
  optim::Optimizer sgd{optim::SGDOptions(0.05).momentum(0.9)};
  optim::ParamStore store;
  optim::Window window;
  GraphedResNet(const nn::ResNetConfig& c, int64_t k)
      : model(c, {kGpu, DType::f32, &gen}),
        store(channels_last(model).named_parameters(), optim::ParamStoreOptions()
                                                           .device(kGpu)
                                                           .compute_dtype(DType::bf16)
                                                           .moments(sgd.moments_needed())),
        window(store, sgd, optim::WindowOptions().micro_steps(k).max_grad_norm(5.0)) {
    for (nn::Module* m : model.modules())
      if (auto* bn = dynamic_cast<nn::BatchNorm*>(m)) window.add_listener(bn);
  }
};

TEST(GpuResNet, graphed_windows_with_window_statistics_are_bitwise_the_eager_ones) {
  ACCRUE_REQUIRE_CUDA();
  const test::GraphPoolScope pool;
  nn::ResNetConfig c;
  c.bottleneck = true;
  c.blocks = {1, 1};
  c.width = 8;
  c.num_classes = 5;
  const int64_t K = 3, windows = 4;
  std::vector<std::pair<Tensor, Tensor>> batches;
  Generator data(3);
  for (int64_t i = 0; i < windows * K; ++i) {
    const Tensor x = test::as_channels_last(
        test::random_normal({4, 3, 32, 32}, DType::f32).to(DType::bf16).to(kGpu));
    ASSERT_TRUE(x.is_channels_last());  // the buffers keep it (Note [Graphed window])
    batches.emplace_back(x, randint(0, 5, {4}, DType::i64, Device::cpu(), &data).to(kGpu));
  }
  GraphedResNet eager(c, K);
  std::vector<optim::WindowReport> eager_reports;
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t k = 0; k < K; ++k) {
      const auto& [x, y] = batches[static_cast<size_t>(w * K + k)];
      eager.window.backward(cross_entropy(eager.model.forward(x), y));
    }
    eager.window.close();
    eager_reports.push_back(eager.window.report());
  }
  for (auto [lag, concurrent] : {std::pair{0, 1}, {1, 1}, {2, 1}, {0, 2}}) {
    SCOPED_TRACE("weight-gradient branch lag " + std::to_string(lag) + ", " +
                 std::to_string(concurrent) + " micro-batches in flight");
    GraphedResNet graphed(c, K);
    std::vector<optim::WindowReport> graphed_reports;
    optim::GraphedWindow g(graphed.window, [&](const std::vector<Tensor>& in) {
      return cross_entropy(graphed.model.forward(in[0]), in[1]);
    });
    g.set_concurrent_micro_batches(concurrent);
    g.set_weight_grad_branch(lag);
    EXPECT_EQ(g.why_eager(), "");
    for (int64_t w = 0; w < windows; ++w) {
      for (int64_t k = 0; k < K; ++k) {
        const auto& [x, y] = batches[static_cast<size_t>(w * K + k)];
        g.backward({x, y});
      }
      g.close();
      graphed_reports.push_back(graphed.window.report());
    }
    // Micro-steps "first" and "rest" (with 2 in flight: a group of 2, then
    // one of 1, as K = 3), and the close.
    EXPECT_EQ(g.counts().graphs, 3);
    EXPECT_GT(g.counts().replayed_closes, 0);
    // Two captures, each with 9 convolutions (the stem, 3 a block and a
    // downsample in each of the 2 blocks) and the classifier's Linear.
    EXPECT_EQ(g.weight_grad_branch_entries(), lag == 0 ? 0 : 20);
    EXPECT_TRUE(test::all_equal(graphed.store.master(), eager.store.master()));
    EXPECT_TRUE(test::all_equal(graphed.store.moment(0), eager.store.moment(0)));
    EXPECT_TRUE(test::all_equal(graphed.store.compute(), eager.store.compute()));
    const std::vector<nn::NamedParameter> a = graphed.model.named_buffers(),
                                          b = eager.model.named_buffers();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)  // the running statistics
      EXPECT_TRUE(test::all_equal(a[i].tensor, b[i].tensor)) << a[i].name;
    for (size_t w = 0; w < eager_reports.size(); ++w) {
      EXPECT_EQ(graphed_reports[w].loss, eager_reports[w].loss) << "window " << w;
      EXPECT_EQ(graphed_reports[w].grad_norm, eager_reports[w].grad_norm) << "window " << w;
    }
  }
}

}  // namespace
}  // namespace accrue
