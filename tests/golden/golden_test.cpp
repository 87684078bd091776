// Golden tests: accrue's optimizers, dynamic loss scaler and gradient clipping,
// driven through the public API (GradArena, Optimizer, Window), against
// trajectories recorded from PyTorch by tests/golden/make_golden.py.
//
// Each step's gradient is injected through autograd: the loss is
// sum_i sum(p_i * g_i) with the recorded g_i as constants, so dL/dp_i = g_i
// exactly, and its count is 1, so N = 1 and the window's coefficient is
// 1 / scale (a power of two) times the clip factor. What differs from torch is
// then only the optimizer arithmetic (rounding order, fused multiply-adds),
// which the tolerances below bound.
//
// Without the fixture directory every test skips and says how to make it; with
// it, a missing or malformed file fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/ops.h"
#include "accrue/core/tensor_io.h"
#include "accrue/optim/loss_scaler.h"
#include "accrue/optim/optimizer.h"
#include "accrue/optim/window.h"

#ifndef ACCRUE_GOLDEN_DIR
#error "ACCRUE_GOLDEN_DIR must name the fixture directory (see tests/golden/CMakeLists.txt)"
#endif

namespace accrue {
namespace {

// Parameters: |a - b| <= kParamRtol |b| + kParamAtol max(1, max |b|), elementwise
// per parameter and step. The values are of order 1; the floor covers elements
// that pass near zero, which keep the rounding (about an ulp, ~1e-7 relative)
// of the larger values they came from: torch's CPU kernels fuse a + alpha * b
// into one FMA where accrue's CPU reference rounds twice.
constexpr double kParamRtol = 1e-6;
constexpr double kParamAtol = 1e-7;
// Final optimizer moments: the same relative bound, with a floor relative to
// the tensor's largest magnitude (a momentum element that cancels to near
// zero keeps the rounding of the terms that cancelled).
constexpr double kStateRtol = 1e-6;
constexpr double kStateAtolOfMax = 1e-6;
// Clipped gradients (sets range from 1e-4 to 1e3 in magnitude): relative, with
// a floor of 1e-7 of the set's largest magnitude.
constexpr double kClipRtol = 1e-6;
constexpr double kClipAtolOfMax = 1e-7;
// Scalars (norms, clip coefficients): relative.
constexpr double kScalarRtol = 1e-6;

#define ACCRUE_REQUIRE_GOLDEN_FIXTURES()                                                   \
  do {                                                                                     \
    if (!std::filesystem::is_directory(ACCRUE_GOLDEN_DIR))                                 \
      GTEST_SKIP() << "no golden fixtures at " ACCRUE_GOLDEN_DIR                           \
                      "; generate them with PyTorch: python3 tests/golden/make_golden.py " \
                      "--out tests/golden/fixtures";                                       \
  } while (0)

// One fixture file: its tensors and its string metadata.
class Fixture {
 public:
  explicit Fixture(const std::string& file) : path_(std::string(ACCRUE_GOLDEN_DIR) + "/" + file) {
    ACCRUE_CHECK(std::filesystem::is_regular_file(path_), "golden fixture ", path_,
                 " is missing: regenerate the fixtures with tests/golden/make_golden.py");
    tensors_ = load_safetensors(path_, &meta_);
  }

  const Tensor& tensor(const std::string& key) const {
    auto it = tensors_.find(key);
    ACCRUE_CHECK(it != tensors_.end(), path_, ": no tensor '", key, "'");
    return it->second;
  }
  bool has_tensor(const std::string& key) const { return tensors_.count(key) != 0; }
  const std::string& str(const std::string& key) const {
    auto it = meta_.find(key);
    ACCRUE_CHECK(it != meta_.end(), path_, ": no metadata '", key, "'");
    return it->second;
  }
  double number(const std::string& key) const {
    const std::string& s = str(key);
    size_t used = 0;
    double v = 0.0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ACCRUE_CHECK(used == s.size() && used > 0, path_, ": metadata '", key, "' = '", s,
                 "' is not a number");
    return v;
  }
  bool flag(const std::string& key) const {
    const std::string& s = str(key);
    ACCRUE_CHECK(s == "true" || s == "false", path_, ": metadata '", key, "' = '", s,
                 "' is not true/false");
    return s == "true";
  }
  int64_t steps() const {
    const double v = number("steps");
    ACCRUE_CHECK(v >= 1 && v == std::floor(v), path_, ": invalid steps ", v);
    return static_cast<int64_t>(v);
  }
  int64_t num_params() const {
    const double v = number("num_params");
    ACCRUE_CHECK(v >= 1 && v == std::floor(v), path_, ": invalid num_params ", v);
    return static_cast<int64_t>(v);
  }
  // A per-step record: tensor `key` has `steps` rows; returns row t.
  Tensor row(const std::string& key, int64_t t) const {
    const Tensor& x = tensor(key);
    ACCRUE_CHECK(x.dim() >= 1 && x.size(0) == steps(), path_, ": tensor '", key, "' has shape ",
                 shape_str(x.shape()), ", expected ", steps(), " rows");
    return x.select(0, t).contiguous();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> meta_;
};

// The worst element seen by a family of comparisons, printed at the end of a test.
struct Worst {
  double abs_err = 0.0;
  double rel_err = 0.0;       // |a - b| / |b| where b != 0
  double of_tolerance = 0.0;  // |a - b| / (rtol |b| + atol): <= 1 passes
  std::string where;

  void print(const std::string& what) const {
    std::printf("[golden] %-28s worst |a-b| %.3g, worst |a-b|/|b| %.3g, %.3f of tolerance (%s)\n",
                what.c_str(), abs_err, rel_err, of_tolerance, where.c_str());
  }
};

// Elementwise |actual - expected| <= rtol |expected| + atol; NaN never passes.
::testing::AssertionResult close_to(const Tensor& actual, const Tensor& expected, double rtol,
                                    double atol, const std::string& what, Worst& worst) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                         << " vs expected " << shape_str(expected.shape());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> b = expected.to_vector<double>();
  int64_t bad = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(a[i] - b[i]);
    const double bound = rtol * std::fabs(b[i]) + atol;
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0.0 : INFINITY);
    if (!(err <= bound)) {  // also catches NaN
      if (bad < 0) bad = static_cast<int64_t>(i);
    }
    if (std::isnan(err) || ratio > worst.of_tolerance) {
      worst.of_tolerance = std::isnan(err) ? INFINITY : ratio;
      worst.where = what + "[" + std::to_string(i) + "]";
    }
    worst.abs_err = std::max(worst.abs_err, err);
    if (b[i] != 0) worst.rel_err = std::max(worst.rel_err, err / std::fabs(b[i]));
  }
  if (bad < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << bad << " is " << a[bad] << ", expected " << b[bad]
         << " (|diff| " << std::fabs(a[bad] - b[bad]) << " > " << rtol << " * |expected| + " << atol
         << ")";
}

// -t, without recording anything.
Tensor negated(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  for (double& x : v)
    x = -x;
  return from_vector(v, t.shape(), t.dtype());
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : t.to_vector<double>())
    m = std::max(m, std::fabs(v));
  return m;
}

::testing::AssertionResult params_close(const Tensor& actual, const Tensor& expected,
                                        const std::string& what, Worst& worst) {
  return close_to(actual, expected, kParamRtol, kParamAtol * std::max(1.0, max_abs(expected)), what,
                  worst);
}

::testing::AssertionResult scalar_close(double actual, double expected, const std::string& what) {
  if (std::fabs(actual - expected) <= kScalarRtol * std::fabs(expected))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << actual << ", expected " << expected << " (relative error "
         << std::fabs(actual - expected) / std::fabs(expected) << " > " << kScalarRtol << ")";
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Fixture& f, const std::string& c) {
  const std::string& kind = f.str(c + ".optimizer");
  const double lr = f.number(c + ".lr");
  if (kind == "SGD") {
    return std::make_unique<optim::Optimizer>(optim::SGDOptions(lr)
                                                  .momentum(f.number(c + ".momentum"))
                                                  .dampening(f.number(c + ".dampening"))
                                                  .nesterov(f.flag(c + ".nesterov"))
                                                  .weight_decay(f.number(c + ".weight_decay")));
  }
  auto adam = [&](auto options) {
    return std::make_unique<optim::Optimizer>(
        options.betas(f.number(c + ".beta1"), f.number(c + ".beta2"))
            .eps(f.number(c + ".eps"))
            .weight_decay(f.number(c + ".weight_decay"))
            .amsgrad(f.flag(c + ".amsgrad")));
  };
  if (kind == "Adam") return adam(optim::AdamOptions(lr));
  if (kind == "AdamW") return adam(optim::AdamWOptions(lr));
  ACCRUE_FAIL(f.path(), ": case '", c, "' has unknown optimizer '", kind, "'");
}

// Parameters, arena, optimizer and window of one run, from `initial` values.
struct TrainingRun {
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<optim::Window> window;

  TrainingRun(std::vector<Tensor> initial, std::unique_ptr<optim::Optimizer> opt,
              const optim::WindowOptions& options)
      : params(std::move(initial)), optimizer(std::move(opt)) {
    for (Tensor& p : params)
      requires_grad_(p);
    arena = std::make_unique<optim::ParamStore>(
        params, optim::ParamStoreOptions().moments(optimizer->moments_needed()));
    window = std::make_unique<optim::Window>(*arena, *optimizer, options);
  }

  // One window of one micro-step whose gradient is exactly `grads` (times the
  // loss scale during backward): loss = sum_i sum(p_i * g_i), count 1.
  void step(const std::vector<Tensor>& grads) {
    Loss loss;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor term = sum(mul(params[i], grads[i]));
      loss.sum = loss.sum.defined() ? add(loss.sum, term) : term;
    }
    loss.count = full({}, 1.0, DType::i64);
    window->backward(loss);
    ASSERT_TRUE(window->ready());
    window->close();
  }

  // Slot i of moment arena k, shaped like parameter i.
  Tensor moment(int k, size_t i) const {
    const optim::ParamStore::Slot& s = arena->slots()[i];
    return arena->moment(k).narrow(0, s.offset, s.numel).reshape(s.shape);
  }
};

std::vector<Tensor> fixture_params(const Fixture& f, const std::string& prefix) {
  std::vector<Tensor> out;
  for (int64_t i = 0; i < f.num_params(); ++i)
    out.push_back(f.tensor(prefix + "." + std::to_string(i)).clone());
  return out;
}

std::vector<Tensor> fixture_grads(const Fixture& f, int64_t t) {
  std::vector<Tensor> out;
  for (int64_t i = 0; i < f.num_params(); ++i)
    out.push_back(f.row("grads." + std::to_string(i), t));
  return out;
}

// torch's state names for accrue's moment arenas (optim/optimizer.cpp's order).
std::vector<std::string> moment_names(const optim::Optimizer& opt) {
  if (opt.kind() == optim::OptimizerKind::SGD) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

// Replays optimizers.safetensors case `c`: params after every step, then the
// final moments, against torch.
void check_optimizer_case(const Fixture& f, const std::string& c) {
  SCOPED_TRACE("case " + c);
  TrainingRun run(fixture_params(f, "init"), make_optimizer(f, c),
                  optim::WindowOptions().micro_steps(1));
  Worst params_worst, state_worst;
  for (int64_t t = 0; t < f.steps(); ++t) {
    run.step(fixture_grads(f, t));
    for (size_t i = 0; i < run.params.size(); ++i) {
      const std::string key = c + ".params." + std::to_string(i);
      ASSERT_TRUE(params_close(run.arena->master_view(i), f.row(key, t),
                               key + " step " + std::to_string(t), params_worst));
    }
  }
  const optim::WindowReport r = run.window->report();
  EXPECT_EQ(r.optimizer_steps, f.steps());
  EXPECT_EQ(r.skipped_windows, 0);

  const std::vector<std::string> names = moment_names(*run.optimizer);
  for (int k = 0; k < run.optimizer->moments_needed(); ++k) {
    for (size_t i = 0; i < run.params.size(); ++i) {
      const std::string key = c + "." + names[k] + "." + std::to_string(i);
      const Tensor& expected = f.tensor(key);
      EXPECT_TRUE(close_to(run.moment(k, i), expected, kStateRtol,
                           kStateAtolOfMax * max_abs(expected), key, state_worst));
    }
  }
  params_worst.print(c + " params");
  if (run.optimizer->moments_needed() > 0) state_worst.print(c + " state");
}

TEST(GoldenCpu, adamw_trajectories_match_torch) {
  ACCRUE_REQUIRE_GOLDEN_FIXTURES();
  const Fixture f("optimizers.safetensors");
  for (const char* c : {"adamw", "adamw_amsgrad"})
    check_optimizer_case(f, c);
}

TEST(GoldenCpu, adam_l2_trajectories_match_torch) {
  ACCRUE_REQUIRE_GOLDEN_FIXTURES();
  const Fixture f("optimizers.safetensors");
  for (const char* c : {"adam", "adam_amsgrad"})
    check_optimizer_case(f, c);
}

TEST(GoldenCpu, sgd_trajectories_match_torch) {
  ACCRUE_REQUIRE_GOLDEN_FIXTURES();
  const Fixture f("optimizers.safetensors");
  for (const char* c :
       {"sgd_plain", "sgd_weight_decay", "sgd_momentum", "sgd_momentum_dampening", "sgd_nesterov"})
    check_optimizer_case(f, c);
}

// torch.amp.GradScaler with injected inf/NaN/overflowing gradients: the scale
// each window uses, the skip flags, the scale after each update and the
// parameters all follow torch; a skipped window leaves the parameters bitwise
// unchanged.
void check_scaler_case(const Fixture& f, const std::string& c) {
  SCOPED_TRACE("case " + c);
  const optim::LossScalerOptions scaler =
      optim::LossScalerOptions::dynamic()
          .init_scale(f.number("scaler.init_scale"))
          .growth_factor(f.number("scaler.growth_factor"))
          .backoff_factor(f.number("scaler.backoff_factor"))
          .growth_interval(static_cast<int64_t>(f.number("scaler.growth_interval")));
  TrainingRun run(fixture_params(f, "init"), make_optimizer(f, c),
                  optim::WindowOptions().micro_steps(1).scaler(scaler));
  const std::vector<double> scale_used = f.tensor(c + ".scale_used").to_vector<double>();
  const std::vector<double> scale_after = f.tensor(c + ".scale_after").to_vector<double>();
  const std::vector<int64_t> skipped = f.tensor(c + ".skipped").to_vector<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(scale_used.size()), f.steps());
  ASSERT_EQ(static_cast<int64_t>(scale_after.size()), f.steps());
  ASSERT_EQ(static_cast<int64_t>(skipped.size()), f.steps());

  Worst worst;
  int64_t skips = 0;
  for (int64_t t = 0; t < f.steps(); ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    // The scale this window's backward is seeded with: exact (powers of two).
    EXPECT_EQ(run.window->state().to_vector<double>()[kernels::kScale], scale_used[t]);
    const Tensor before = run.arena->master().clone();
    run.step(fixture_grads(f, t));
    const optim::WindowReport r = run.window->report();
    EXPECT_EQ(r.skipped, skipped[t] != 0);
    EXPECT_EQ(r.loss_scale, scale_after[t]);
    skips += skipped[t] != 0;
    if (skipped[t] != 0) {
      // Note [Skipped window]: bitwise unchanged.
      EXPECT_EQ(run.arena->master().to_vector<float>(), before.to_vector<float>());
    }
    for (size_t i = 0; i < run.params.size(); ++i) {
      const std::string key = c + ".params." + std::to_string(i);
      ASSERT_TRUE(params_close(run.arena->master_view(i), f.row(key, t),
                               key + " step " + std::to_string(t), worst));
    }
  }
  EXPECT_GT(skips, 0) << "the fixture should hold skipped steps";
  const optim::WindowReport r = run.window->report();
  EXPECT_EQ(r.skipped_windows, skips);
  EXPECT_EQ(r.optimizer_steps, f.steps() - skips);
  worst.print(c + " params");
}

TEST(GoldenCpu, grad_scaler_sequence_matches_torch) {
  ACCRUE_REQUIRE_GOLDEN_FIXTURES();
  const Fixture f("grad_scaler.safetensors");
  for (const char* c : {"scaler_sgd", "scaler_adamw"})
    check_scaler_case(f, c);
}

// torch.nn.utils.clip_grad_norm_: the window's norm is torch's total norm, and
// the clipped gradient (read back through one SGD step with lr 1 from zero
// parameters, p_new = -clip * g exactly) is torch's clipped gradient.
TEST(GoldenCpu, clip_grad_norm_matches_torch) {
  ACCRUE_REQUIRE_GOLDEN_FIXTURES();
  const Fixture f("clip_grad_norm.safetensors");
  for (const char* c : {"clip_unit", "no_clip", "no_clip_tiny", "clip_huge", "clip_mixed_scales"}) {
    SCOPED_TRACE(std::string("case ") + c);
    const std::string name = c;
    const double max_norm = f.number(name + ".max_norm");
    std::vector<Tensor> grads, zeros_init;
    for (int64_t i = 0; i < f.num_params(); ++i) {
      grads.push_back(f.tensor(name + ".grads." + std::to_string(i)));
      // Zero parameters make p_new = 0 - 1 * (clip * g) carry no rounding of
      // its own: the comparison sees the clipping only. The gradients, the
      // values under test, are random.
      zeros_init.push_back(zeros(grads.back().shape()));
    }
    TrainingRun run(zeros_init, std::make_unique<optim::Optimizer>(optim::SGDOptions(1.0)),
                    optim::WindowOptions().micro_steps(1).max_grad_norm(max_norm));
    run.step(grads);
    const optim::WindowReport r = run.window->report();
    const double total_norm = f.tensor(name + ".total_norm").item();
    const double clip_coef = f.tensor(name + ".clip_coef").item();
    EXPECT_TRUE(scalar_close(r.grad_norm, total_norm, name + " total norm"));
    EXPECT_TRUE(scalar_close(r.clip_coef, clip_coef, name + " clip coefficient"));
    EXPECT_EQ(r.clip_coef < 1.0, clip_coef < 1.0) << "clipping must happen exactly when torch's";
    Worst worst;
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::string key = name + ".clipped." + std::to_string(i);
      const Tensor expected = f.tensor(key);
      const Tensor clipped = negated(run.arena->master_view(i));
      EXPECT_TRUE(
          close_to(clipped, expected, kClipRtol, kClipAtolOfMax * max_abs(expected), key, worst));
    }
    std::printf("[golden] %-28s total norm %.9g (torch %.9g), clip %.9g (torch %.9g)\n",
                (name + " norm").c_str(), r.grad_norm, total_norm, r.clip_coef, clip_coef);
    worst.print(name + " clipped");
  }
}

}  // namespace
}  // namespace accrue
