// Note [Gradient noise scale] against a problem whose answer is known: the
// loss of item i is theta . z_i with z_i ~ N(mu, sigma^2 I) in d dimensions,
// so the per-item gradient is z_i whatever theta is: |G|^2 = |mu|^2,
// tr(Sigma) = d sigma^2, and B_simple = d sigma^2 / |mu|^2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "accrue/autograd/ops.h"
#include "accrue/kernels/ops.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr int64_t kDim = 256, kMicroBatch = 8, kK = 8;
constexpr double kMu = 0.25, kSigma = 1.0;

struct LinearRun {
  explicit LinearRun(int64_t every)
      : theta(requires_grad_(zeros({kDim}, DType::f64))),
        opt(optim::SGDOptions(0.0)),
        arena({{"theta", theta}}, optim::ParamStoreOptions().master_dtype(DType::f64).moments(0)),
        window(arena, opt, optim::WindowOptions().micro_steps(kK).noise_scale(every, 0.98)) {}

  void train(int64_t windows, Generator& data) {
    for (int64_t w = 0; w < windows; ++w) {
      for (int64_t k = 0; k < kK; ++k) {
        const Tensor z = kernels::binary_scalar(
            kernels::BinaryOp::Add, randn({kMicroBatch, kDim}, DType::f64, Device::cpu(), &data),
            kMu);
        window.backward({sum(matmul(z, theta)), full({}, double{kMicroBatch}, DType::i64)});
      }
      window.close();
    }
  }

  Tensor theta;
  optim::Optimizer opt;
  optim::ParamStore arena;
  optim::Window window;
};

TEST(NoiseScale, lands_within_ten_percent_of_the_known_value) {
  const double grad_sq = kDim * kMu * kMu, trace = kDim * kSigma * kSigma;
  LinearRun run(1);
  Generator data(17);
  run.train(400, data);
  const optim::WindowReport r = run.window.report();
  std::printf(
      "[noise scale] d=%lld, B_small=%lld, B_big=%lld, %lld windows: |G|^2 %.3f (true "
      "%.3f), tr(Sigma) %.2f (true %.2f), B_simple %.3f (true %.3f)\n",
      static_cast<long long>(kDim), static_cast<long long>(kMicroBatch),
      static_cast<long long>(kMicroBatch * kK), static_cast<long long>(r.noise_windows), r.grad_sq,
      grad_sq, r.trace_sigma, trace, r.noise_scale, trace / grad_sq);
  EXPECT_EQ(r.noise_windows, 400);
  EXPECT_NEAR(r.noise_scale, trace / grad_sq, 0.1 * trace / grad_sq);
  EXPECT_NEAR(r.grad_sq, grad_sq, 0.1 * grad_sq);
  EXPECT_NEAR(r.trace_sigma, trace, 0.1 * trace);
}

TEST(NoiseScale, measures_one_window_in_n_and_needs_k_of_two) {
  LinearRun run(4);
  Generator data(3);
  run.train(10, data);
  EXPECT_EQ(run.window.report().noise_windows, 3);  // windows 0, 4 and 8
  optim::Optimizer sgd(optim::SGDOptions(0.1));
  EXPECT_ERROR(optim::Window(run.arena, sgd, optim::WindowOptions().micro_steps(1).noise_scale(1)),
               "noise scale", "K >= 2");
  EXPECT_ERROR(
      optim::Window(run.arena, sgd, optim::WindowOptions().micro_steps(2).noise_scale(1, 1.0)),
      "NoiseScale", "ema = 1");
}

}  // namespace
}  // namespace accrue
