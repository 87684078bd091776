// Note [Scale calibration] and Note [Gradient observer] on the CPU: the
// observer sees every gradient passed between ops; the calibrated first window
// runs at scale 1 and sets the scale its largest f16 gradient allows (checked
// against an amax measured apart); a start that would skip windows skips none
// once calibrated; bad options are errors.
#include <cmath>
#include <memory>
#include <vector>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/gradient_observer.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

// Records each observed gradient's largest |value| on the host (a test may sync).
struct HostAmax : autograd::GradientObserver {
  std::vector<double> maxima;
  std::vector<DType> dtypes;
  void observe(const Tensor& g) override {
    dtypes.push_back(g.dtype());
    double m = 0.0;
    for (double v : g.to(DType::f64).contiguous().to_vector<double>())
      m = std::max(m, std::fabs(v));
    maxima.push_back(m);
  }
};

TEST(GradientObserver, sees_each_gradient_between_ops_once_and_only_in_its_scope) {
  Tensor x = requires_grad_(from_vector<double>({1.0, -2.0, 3.0}, {3}));
  HostAmax seen;
  {
    autograd::GradientObserverScope scope(&seen);
    // loss = sum(y * y), y = 2x: the nodes of sum, of y * y and of 2x each get
    // their incoming gradient once: 1, ones [3], and 2y = 4x (both factors of
    // y * y summed into y's node).
    const Tensor y = x * 2.0;
    backward(sum(y * y));
  }
  ASSERT_EQ(seen.maxima.size(), 3u);
  EXPECT_EQ(seen.maxima[0], 1.0);   // d loss / d sum
  EXPECT_EQ(seen.maxima[1], 1.0);   // into y * y: ones of shape [3]
  EXPECT_EQ(seen.maxima[2], 12.0);  // into 2x: 2y = 4x, |4 * 3|
  backward(sum(x * 2.0));           // outside the scope: nothing more
  EXPECT_EQ(seen.maxima.size(), 3u);
  EXPECT_EQ(autograd::current_gradient_observer(), nullptr);
}

constexpr int64_t kBatch = 16;

struct Trainer {
  std::unique_ptr<nn::MLP> model;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::Window> window;

  explicit Trainer(const optim::LossScalerOptions& scaler) {
    Generator gen(5);
    model = std::make_unique<nn::MLP>(std::vector<int64_t>{8, 32, 4},
                                      nn::ParamOptions{Device::cpu(), DType::f32, &gen});
    opt = std::make_unique<optim::Optimizer>(optim::AdamWOptions(1e-3));
    arena = std::make_unique<optim::ParamStore>(
        std::vector<NamedParameter>{{"w0", model->parameters()[0]},
                                    {"b0", model->parameters()[1]},
                                    {"w1", model->parameters()[2]},
                                    {"b1", model->parameters()[3]}},
        optim::ParamStoreOptions().compute_dtype(DType::f16).moments(opt->moments_needed()));
    window = std::make_unique<optim::Window>(*arena, *opt,
                                             optim::WindowOptions().micro_steps(2).scaler(scaler));
  }
  // One window of two micro-batches from data seed `w`.
  void window_step(int64_t w) {
    Generator data(100 + static_cast<uint64_t>(w));
    for (int k = 0; k < 2; ++k) {
      const Tensor x = randn({kBatch, 8}, DType::f32, Device::cpu(), &data).to(DType::f16);
      const Tensor y = randint(0, 4, {kBatch}, DType::i64, Device::cpu(), &data);
      window->backward(cross_entropy(model->forward(x), y));
    }
    window->close();
  }
};

double expected_scale(double amax, double margin) {
  return std::exp2(std::floor(std::log2(65504.0 / (amax * margin))));
}

TEST(ScaleCalibration, the_first_window_runs_at_one_and_sets_the_scale_from_its_largest_gradient) {
  // The same first window, observed apart at scale 1 (a fixed scaler of 1 seeds as calibration
  // does).
  HostAmax seen;
  {
    Trainer apart(optim::LossScalerOptions::fixed(1.0));
    autograd::GradientObserverScope scope(&seen);
    apart.window_step(0);
  }
  double amax = 0.0;
  int f16 = 0;
  for (size_t i = 0; i < seen.maxima.size(); ++i)
    if (seen.dtypes[i] == DType::f16) {
      amax = std::max(amax, seen.maxima[i]);
      ++f16;
    }
  ASSERT_GT(f16, 0);
  ASSERT_GT(amax, 0.0);

  for (double margin : {1.0, 8.0, 1000.0}) {
    SCOPED_TRACE(margin);
    Trainer run(optim::LossScalerOptions::dynamic().init_scale(16777216.0).calibrate(true, margin));
    EXPECT_TRUE(run.window->calibrating());
    run.window_step(0);
    EXPECT_FALSE(run.window->calibrating());
    const optim::WindowReport r = run.window->report();
    EXPECT_FALSE(r.skipped);
    const double expected = std::min(std::max(expected_scale(amax, margin), 1.0), 16777216.0);
    EXPECT_EQ(r.loss_scale, expected) << "amax " << amax;
    std::printf("[calibration] amax %.4g at scale 1, margin %g -> scale %g\n", amax, margin,
                r.loss_scale);
  }
}

TEST(ScaleCalibration, a_start_that_skips_windows_skips_none_once_calibrated) {
  // 2^24 overflows f16 in this model's backward.
  Trainer guessed(optim::LossScalerOptions::dynamic().init_scale(16777216.0));
  Trainer calibrated(optim::LossScalerOptions::dynamic().init_scale(16777216.0).calibrate());
  for (int64_t w = 0; w < 6; ++w) {
    guessed.window_step(w);
    calibrated.window_step(w);
  }
  const optim::WindowReport g = guessed.window->report(), c = calibrated.window->report();
  std::printf("[calibration] skipped windows of 6: guessed 2^24 %lld, calibrated %lld (scale %g)\n",
              static_cast<long long>(g.skipped_windows), static_cast<long long>(c.skipped_windows),
              c.loss_scale);
  EXPECT_GE(g.skipped_windows, 1);
  EXPECT_EQ(c.skipped_windows, 0);
  EXPECT_GT(c.loss_scale, 1.0);  // a useful scale, not the calibration's 1
}

TEST(ScaleCalibration, the_scale_is_clamped_and_a_skipped_or_empty_window_changes_nothing) {
  Tensor state = kernels::make_window_state(1.0, Device::cpu());
  kernels::ScalerConfig dyn = optim::LossScalerOptions::dynamic().max_scale(1024).config();
  auto scale_of = [&](double amax, double margin) {
    state.narrow(0, kernels::kScale, 1).fill_(1.0);
    kernels::calibrate_loss_scale(from_vector<double>({amax}, {1}), state, dyn, 1.0, margin);
    return state.to_vector<double>()[kernels::kScale];
  };
  EXPECT_EQ(scale_of(1.0, 8.0), 1024.0);    // 65504 / 8 = 8188 -> 4096, clamped to 1024
  EXPECT_EQ(scale_of(100.0, 8.0), 64.0);    // 65504 / 800 = 81.9 -> 64
  EXPECT_EQ(scale_of(1e6, 1.0), 1.0);       // below min_scale 1 -> 1
  EXPECT_EQ(scale_of(0.0, 8.0), 1.0);       // nothing observed: unchanged
  EXPECT_EQ(scale_of(INFINITY, 8.0), 1.0);  // non-finite: unchanged
  state.narrow(0, kernels::kFoundInf, 1).fill_(1.0);
  EXPECT_EQ(scale_of(100.0, 8.0), 1.0);  // a skipped window: the scaler's backoff stands
  EXPECT_ERROR(kernels::calibrate_loss_scale(from_vector<double>({1.0}, {1}), state, dyn, 1.0, 0.5),
               "calibrate_loss_scale", "margin 0.5");
  EXPECT_ERROR(
      kernels::calibrate_loss_scale(from_vector<double>({1.0, 2.0}, {2}), state, dyn, 1.0, 8.0),
      "calibrate_loss_scale", "amax has 2 elements");
  EXPECT_ERROR(kernels::calibrate_loss_scale(from_vector<double>({1.0}, {1}), state,
                                             optim::LossScalerOptions::none().config(), 1.0, 8.0),
               "calibrate_loss_scale", "dynamic loss scaler");
}

TEST(ScaleCalibration, bad_options_are_errors) {
  EXPECT_ERROR(optim::LossScalerOptions::fixed(4.0).calibrate().validate(), "LossScaler",
               "calibrate() needs the dynamic scaler", "static");
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().calibrate(true, 0.5).validate(), "LossScaler",
               "calibration margin = 0.5");
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().calibrate(true, NAN).validate(), "LossScaler",
               "calibration margin");
}

}  // namespace
}  // namespace accrue
