// Note [Layer monitor] on the CPU in f64, both ways of getting the sums (the
// close's fused pass, Note [Step sums], and separate passes): per-layer
// gradient norms against the gradient of the whole window computed apart,
// update ratios against the weights before and after, an unused layer, a
// skipped window, misuse.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/nn/module.h"
#include "accrue/optim/layer_monitor.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

const nn::ParamOptions kF64{Device::cpu(), DType::f64, nullptr};

struct Batch {
  Tensor x, y;
};

// Each test runs with the sums from the close's fused pass (true) and from
// separate passes (false).
class LayerMonitorBothWays : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<optim::LayerMonitor> make(const optim::ParamStore& arena, optim::Optimizer& opt) {
    return GetParam() ? std::make_unique<optim::LayerMonitor>(arena, opt)
                      : std::make_unique<optim::LayerMonitor>(arena);
  }
};
INSTANTIATE_TEST_SUITE_P(Sums, LayerMonitorBothWays, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "in_the_fused_pass" : "separate_passes";
                         });

std::vector<Batch> batches(int k) {
  std::vector<Batch> b;
  Generator data(11);
  for (int i = 0; i < k; ++i)
    b.push_back({randn({5, 4}, DType::f64, Device::cpu(), &data),
                 randint(0, 3, {5}, DType::i64, Device::cpu(), &data)});
  return b;
}

TEST_P(LayerMonitorBothWays, layer_norms_and_update_ratios_match_a_separate_computation) {
  Generator g1(3), g2(3);
  // fc0.w has 10,000 elements: more than one norm row (8,192 on the CPU, Note
  // [Norm rows]), so a layer's figures are the sum of its rows.
  nn::MLP model({4, 2500, 3}, {Device::cpu(), DType::f64, &g1});
  nn::MLP reference({4, 2500, 3}, {Device::cpu(), DType::f64, &g2});  // same initial weights
  optim::Optimizer opt(optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::ParamStore arena(
      {{"fc0.w", model.parameters()[0]},
       {"fc0.b", model.parameters()[1]},
       {"fc1.w", model.parameters()[2]},
       {"fc1.b", model.parameters()[3]}},
      optim::ParamStoreOptions().master_dtype(DType::f64).moments(opt.moments_needed()));
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(2).max_grad_norm(0.1));
  const std::unique_ptr<optim::LayerMonitor> made = make(arena, opt);
  optim::LayerMonitor& monitor = *made;
  const std::vector<Batch> b = batches(2);
  for (const Batch& mb : b)
    window.backward(cross_entropy(model.forward(mb.x), mb.y));
  std::vector<Tensor> before;
  for (const Tensor& p : model.parameters())
    before.push_back(detach(p).clone());
  monitor.before_close();
  window.close();
  monitor.after_close();
  const optim::WindowReport r = window.report();
  const std::vector<optim::LayerReport> layers = monitor.read(r);
  ASSERT_EQ(layers.size(), 4u);

  // The window's gradient apart: the summed loss of both micro-batches over N = 10.
  Tensor total = full({}, 0.0, DType::f64);
  for (const Batch& mb : b)
    total = total + cross_entropy(reference.forward(mb.x), mb.y).sum;
  backward(total / 10.0);
  double squares = 0.0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Tensor g = grad(reference.parameters()[i]);
    const double expected = std::sqrt(accrue::sum(g * g).item());
    EXPECT_NEAR(layers[i].grad_norm, expected, 1e-12 * expected) << layers[i].name;
    squares += layers[i].grad_norm * layers[i].grad_norm;
    const Tensor now = detach(model.parameters()[i]);
    const Tensor delta = now - before[i];
    const double ratio =
        std::sqrt(accrue::sum(delta * delta).item() / accrue::sum(before[i] * before[i]).item());
    EXPECT_NEAR(layers[i].update_ratio, ratio, 1e-12 * ratio) << layers[i].name;
    EXPECT_GT(layers[i].update_ratio, 0.0);
  }
  EXPECT_NEAR(std::sqrt(squares), r.grad_norm, 1e-12 * r.grad_norm);
  EXPECT_EQ(layers[0].name, "fc0.w");
  EXPECT_GT(monitor.total_update_ratio(), 0.0);
}

TEST_P(LayerMonitorBothWays, group_figures_gather_their_layers) {
  Generator g1(3);
  nn::MLP model({4, 6, 3}, {Device::cpu(), DType::f64, &g1});
  optim::Optimizer opt(optim::AdamWOptions(1e-2).weight_decay(0.1));
  const std::vector<Tensor> params = model.parameters();  // fc0.w, fc0.b, fc1.w, fc1.b
  opt.add_param_group({params[1], params[3]}, optim::GroupOptions().weight_decay(0.0));
  optim::ParamStore arena(
      {{"fc0.w", params[0]}, {"fc0.b", params[1]}, {"fc1.w", params[2]}, {"fc1.b", params[3]}},
      optim::ParamStoreOptions().master_dtype(DType::f64).moments(opt.moments_needed()));
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(2));
  const std::unique_ptr<optim::LayerMonitor> made = make(arena, opt);
  optim::LayerMonitor& monitor = *made;
  for (const Batch& mb : batches(2))
    window.backward(cross_entropy(model.forward(mb.x), mb.y));
  std::vector<std::vector<double>> before;
  for (const Tensor& p : params)
    before.push_back(detach(p).clone().to_vector<double>());
  monitor.before_close();
  window.close();
  monitor.after_close();
  const std::vector<optim::LayerReport> layers = monitor.read(window.report());
  EXPECT_EQ(opt.slot_groups(arena), (std::vector<int>{0, 1, 0, 1}));
  const std::vector<optim::GroupReport> groups = monitor.groups(opt.slot_groups(arena));
  ASSERT_EQ(groups.size(), 2u);
  for (const optim::GroupReport& g : groups) {
    SCOPED_TRACE(g.group);
    double norm_sq = 0.0, delta_sq = 0.0, weight_sq = 0.0;
    for (size_t i = static_cast<size_t>(g.group); i < params.size(); i += 2) {  // 0, 2 or 1, 3
      norm_sq += layers[i].grad_norm * layers[i].grad_norm;
      const std::vector<double> now = detach(params[i]).to_vector<double>();
      for (size_t j = 0; j < now.size(); ++j) {
        delta_sq += (now[j] - before[i][j]) * (now[j] - before[i][j]);
        weight_sq += before[i][j] * before[i][j];
      }
    }
    EXPECT_NEAR(g.grad_norm, std::sqrt(norm_sq), 1e-12 * std::sqrt(norm_sq));
    const double ratio = std::sqrt(delta_sq / weight_sq);
    EXPECT_NEAR(g.update_ratio, ratio, 1e-12 * ratio);
  }
  EXPECT_ERROR(monitor.groups({0, 1}), "LayerMonitor::groups", "2 group indices for 4 slots");
}

TEST_P(LayerMonitorBothWays, an_unused_layer_and_a_skipped_window) {
  Generator g(5);
  nn::MLP model({4, 6, 3}, {Device::cpu(), DType::f64, &g});
  Tensor unused = requires_grad_(zeros({7}, DType::f64) + 1.0);
  std::vector<Tensor> params = model.parameters();
  params.push_back(unused);
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::ParamStore arena({{"a", params[0]},
                           {"b", params[1]},
                           {"c", params[2]},
                           {"d", params[3]},
                           {"unused", params[4]}},
                          optim::ParamStoreOptions().master_dtype(DType::f64).moments(0));
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(1));
  const std::unique_ptr<optim::LayerMonitor> made = make(arena, opt);
  optim::LayerMonitor& monitor = *made;
  arena.grad_view(4).fill_(std::numeric_limits<double>::quiet_NaN());  // stale, nobody writes it
  const Batch mb = batches(1)[0];
  window.backward(cross_entropy(model.forward(mb.x), mb.y));
  monitor.before_close();
  window.close();
  monitor.after_close();
  std::vector<optim::LayerReport> layers = monitor.read(window.report());
  EXPECT_EQ(layers[4].grad_norm, 0.0);     // the close zeroed its slot
  EXPECT_EQ(layers[4].update_ratio, 0.0);  // plain SGD, zero gradient: unchanged
  EXPECT_TRUE(std::isfinite(layers[0].grad_norm));

  // A non-finite gradient skips the window: nothing moves.
  window.backward(
      {cross_entropy(model.forward(mb.x), mb.y).sum * INFINITY, full({}, 5.0, DType::i64)});
  monitor.before_close();
  window.close();
  monitor.after_close();
  ASSERT_TRUE(window.report().skipped);
  layers = monitor.read(window.report());
  for (const optim::LayerReport& l : layers)
    EXPECT_EQ(l.update_ratio, 0.0) << l.name;
}

TEST(LayerMonitor, misuse_is_an_error) {
  Generator g(6);
  nn::MLP model({2, 2}, {Device::cpu(), DType::f64, &g});
  optim::ParamStore arena(model.named_parameters(),
                          optim::ParamStoreOptions().master_dtype(DType::f64).moments(0));
  optim::LayerMonitor monitor(arena);
  EXPECT_ERROR(monitor.read(optim::WindowReport{}), "LayerMonitor::read", "no window measured");
  EXPECT_ERROR(monitor.after_close(), "LayerMonitor::after_close", "before_close");

  // In the fused pass: an after_close with no close between is refused.
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::LayerMonitor in_pass(arena, opt);
  EXPECT_ERROR(in_pass.read(optim::WindowReport{}), "LayerMonitor::read", "no window measured");
  in_pass.before_close();
  EXPECT_ERROR(in_pass.after_close(), "LayerMonitor::after_close",
               "ran 0 eager optimizer passes with step sums", "expected 1");
}

// The two ways give the same figures, under UnusedParameters::skip (an
// unused slot's weights count in the total ratio, its update is 0) with
// AdamW, two groups and clipping, over three windows.
TEST(LayerMonitor, the_fused_pass_and_separate_passes_agree) {
  struct Run {
    Generator g{8};
    nn::MLP model{{4, 40, 3}, {Device::cpu(), DType::f64, &g}};
    Tensor unused = requires_grad_(zeros({70}, DType::f64) + 0.5);
    std::vector<Tensor> params;
    optim::Optimizer opt{optim::AdamWOptions(1e-2).weight_decay(0.1)};
    std::unique_ptr<optim::ParamStore> arena;
    std::unique_ptr<optim::Window> window;
    std::unique_ptr<optim::LayerMonitor> monitor;
    explicit Run(bool in_pass) {
      params = model.parameters();
      params.push_back(unused);
      opt.add_param_group({params[1], params[3]}, optim::GroupOptions().weight_decay(0.0));
      arena = std::make_unique<optim::ParamStore>(
          std::vector<NamedParameter>{{"a", params[0]},
                                      {"b", params[1]},
                                      {"c", params[2]},
                                      {"d", params[3]},
                                      {"unused", params[4]}},
          optim::ParamStoreOptions().master_dtype(DType::f64).moments(opt.moments_needed()));
      window = std::make_unique<optim::Window>(
          *arena, opt,
          optim::WindowOptions().micro_steps(2).max_grad_norm(0.05).unused_parameters(
              optim::UnusedParameters::skip));
      monitor = in_pass ? std::make_unique<optim::LayerMonitor>(*arena, opt)
                        : std::make_unique<optim::LayerMonitor>(*arena);
    }
    std::vector<optim::LayerReport> window_of(const std::vector<Batch>& b) {
      for (const Batch& mb : b)
        window->backward(cross_entropy(model.forward(mb.x), mb.y));
      monitor->before_close();
      window->close();
      monitor->after_close();
      return monitor->read(window->report());
    }
  };
  Run fused(true), separate(false);
  for (int w = 0; w < 3; ++w) {
    SCOPED_TRACE(w);
    const std::vector<Batch> b = batches(2);
    const std::vector<optim::LayerReport> x = fused.window_of(b), y = separate.window_of(b);
    ASSERT_EQ(x.size(), 5u);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(x[i].grad_norm, y[i].grad_norm, 1e-12 * y[i].grad_norm) << y[i].name;
      EXPECT_NEAR(x[i].update_ratio, y[i].update_ratio, 1e-12 * y[i].update_ratio) << y[i].name;
    }
    EXPECT_EQ(x[4].update_ratio, 0.0);
    EXPECT_GT(x[0].update_ratio, 0.0);
    EXPECT_NEAR(fused.monitor->total_update_ratio(), separate.monitor->total_update_ratio(),
                1e-12 * separate.monitor->total_update_ratio());
    const std::vector<int> groups = fused.opt.slot_groups(*fused.arena);
    const std::vector<optim::GroupReport> gx = fused.monitor->groups(groups),
                                          gy = separate.monitor->groups(groups);
    ASSERT_EQ(gx.size(), gy.size());
    for (size_t i = 0; i < gx.size(); ++i) {
      EXPECT_NEAR(gx[i].grad_norm, gy[i].grad_norm, 1e-12 * gy[i].grad_norm);
      EXPECT_NEAR(gx[i].update_ratio, gy[i].update_ratio, 1e-12 * gy[i].update_ratio);
    }
  }
}

}  // namespace
}  // namespace accrue
