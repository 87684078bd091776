// GPT-2 against PyTorch on CUDA (every test skips without a GPU):
//
// - f32 with TF32 off: accrue's tiny nn::GPT2, trained on the GPU exactly as
//   gpt2_golden_test.cpp trains it on the CPU, lands within 1e-5 of PyTorch's
//   float64 run (the truth, not another float32 run: the claim is then about
//   accrue's rounding alone). When PyTorch's own CUDA float32 run is in the
//   fixtures, its distance from float64 is printed beside accrue's, as the
//   yardstick of what float32 costs.
// - bf16: accrue with a bf16 compute copy (fp32 master weights, gradients and
//   AdamW) against PyTorch under torch.autocast(bfloat16) with fp32
//   parameters, 50 windows: both loss curves printed side by side, every
//   window's loss within 2%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/equivalence/equivalence_util.h"
#include "tests/golden/gpt2_golden.h"
#include "tests/test_util.h"

namespace accrue::golden {
namespace {

// f32 against torch's f64: per-window loss and gradient norm (relative) and
// the final parameters (||a - b|| / ||b|| over all of them).
constexpr double kF32Tol = 1e-5;
// bf16 compute against torch's bf16 autocast: every window's loss, relative.
constexpr double kBf16LossTol = 0.02;

std::string fixture_path(const std::string& file) {
  return std::string(ACCRUE_GPT2_GOLDEN_DIR) + "/" + file;
}

double relative(double a, double b) {
  return std::fabs(a - b) / std::fabs(b);
}

RunOptions cuda_run(DType compute, int64_t micro_steps, const Schedule& schedule) {
  RunOptions o;
  o.device = Device::cuda(0);
  o.master_dtype = DType::f32;
  o.compute_dtype = compute;
  o.micro_steps = micro_steps;
  o.schedule = schedule;
  return o;
}

// Every parameter of `model`, concatenated in registration order, from `read`.
template <class Read>
std::vector<double> concatenated(const nn::GPT2& model, Read read) {
  std::vector<double> out;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const std::vector<double> v = read(p.name);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(Gpt2GoldenGpu, f32_training_matches_torch_f64) {
  ACCRUE_REQUIRE_CUDA();
  ACCRUE_REQUIRE_GPT2_FIXTURES();
  const equivalence::TF32Off tf32_off;
  const Gpt2Fixture fixture(fixture_path("model.safetensors"));
  const FixtureFile truth(fixture_path("cpu_f64.safetensors"));
  const int64_t windows = truth.integer("windows");
  const std::vector<double> loss64 = truth.tensor("loss").to_vector<double>();
  const std::vector<double> norm64 = truth.tensor("grad_norm").to_vector<double>();
  ASSERT_EQ(static_cast<int64_t>(loss64.size()), windows);
  ASSERT_EQ(static_cast<int64_t>(norm64.size()), windows);

  // PyTorch's CUDA f32 run of the same windows, when the fixtures have it.
  const std::string torch32_path = fixture_path("cuda_f32.safetensors");
  std::unique_ptr<FixtureFile> torch32;
  if (FixtureFile::exists(torch32_path)) torch32 = std::make_unique<FixtureFile>(torch32_path);
  std::vector<double> loss32, norm32;
  if (torch32) {
    loss32 = torch32->tensor("loss").to_vector<double>();
    norm32 = torch32->tensor("grad_norm").to_vector<double>();
    ASSERT_EQ(static_cast<int64_t>(loss32.size()), windows);
  }

  Gpt2Run run(fixture, cuda_run(DType::f32, fixture.micro_steps(), schedule_of(truth)));
  double worst_loss = 0.0, worst_norm = 0.0, torch_loss = 0.0, torch_norm = 0.0;
  std::printf(
      "[gpt2 golden] cuda f32 (TF32 off), K=%d: window, loss (accrue f32, torch f64), grad norm "
      "(accrue f32, torch f64)\n",
      int(fixture.micro_steps()));
  for (int64_t w = 0; w < windows; ++w) {
    const optim::WindowReport r = run.window(w);
    ASSERT_FALSE(r.skipped) << "window " << w;
    std::printf("[gpt2 golden]   %2d  %.9f %.9f  %.9f %.9f\n", int(w), r.loss, loss64[w],
                r.grad_norm, norm64[w]);
    EXPECT_LE(relative(r.loss, loss64[w]), kF32Tol)
        << "window " << w << ": loss " << r.loss << ", torch f64 " << loss64[w];
    EXPECT_LE(relative(r.grad_norm, norm64[w]), kF32Tol)
        << "window " << w << ": grad norm " << r.grad_norm << ", torch f64 " << norm64[w];
    worst_loss = std::max(worst_loss, relative(r.loss, loss64[w]));
    worst_norm = std::max(worst_norm, relative(r.grad_norm, norm64[w]));
    if (torch32) {
      torch_loss = std::max(torch_loss, relative(loss32[w], loss64[w]));
      torch_norm = std::max(torch_norm, relative(norm32[w], norm64[w]));
    }
  }

  const nn::GPT2& model = run.model();
  const std::vector<double> final64 = concatenated(
      model, [&](const std::string& n) { return truth.tensor("final." + n).to_vector<double>(); });
  const std::vector<double> final_accrue =
      concatenated(model, [&](const std::string& n) { return run.master(n); });
  const double param_err = equivalence::l2_relative(final_accrue, final64);
  EXPECT_LE(param_err, kF32Tol) << "final parameters, ||accrue f32 - torch f64|| / ||torch f64||";
  // Per parameter, for the log: where the error sits.
  double worst_slot = 0.0;
  std::string worst_name;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const double e = equivalence::l2_relative(run.master(p.name),
                                              truth.tensor("final." + p.name).to_vector<double>());
    if (e >= worst_slot) {
      worst_slot = e;
      worst_name = p.name;
    }
  }
  std::printf(
      "[gpt2 golden] accrue cuda f32 vs torch f64 over %d windows: loss %.3g, grad norm %.3g "
      "(relative), final parameters %.3g (L2 relative; worst parameter %s %.3g); bound %.0e\n",
      int(windows), worst_loss, worst_norm, param_err, worst_name.c_str(), worst_slot, kF32Tol);
  if (torch32) {
    const std::vector<double> final32 = concatenated(model, [&](const std::string& n) {
      return torch32->tensor("final." + n).to_vector<double>();
    });
    std::printf(
        "[gpt2 golden] torch cuda f32 vs torch f64 (yardstick, %s): loss %.3g, grad norm %.3g, "
        "final parameters %.3g; accrue f32 vs torch f32: final parameters %.3g\n",
        torch32->str("gpu").c_str(), torch_loss, torch_norm,
        equivalence::l2_relative(final32, final64),
        equivalence::l2_relative(final_accrue, final32));
  } else {
    std::printf("[gpt2 golden] (no %s: PyTorch's f32 yardstick not printed)\n",
                torch32_path.c_str());
  }
}

TEST(Gpt2GoldenGpu, bf16_loss_curve_follows_torch_autocast) {
  ACCRUE_REQUIRE_CUDA();
  ACCRUE_REQUIRE_GPT2_FIXTURES();
  const std::string path = fixture_path("cuda_bf16.safetensors");
  ASSERT_TRUE(FixtureFile::exists(path))
      << path << " is missing: make_gpt2_golden.py writes it only where CUDA is available; "
      << "regenerate the fixtures on a GPU machine";
  const Gpt2Fixture fixture(fixture_path("model.safetensors"));
  const FixtureFile torch_run(path);
  const int64_t fixture_windows = torch_run.integer("windows");
  std::vector<double> torch_loss = torch_run.tensor("loss").to_vector<double>();
  std::vector<double> torch_norm = torch_run.tensor("grad_norm").to_vector<double>();
  ASSERT_EQ(static_cast<int64_t>(torch_loss.size()), fixture_windows);
  ASSERT_LE(fixture_windows, fixture.token_windows());
  // Under compute-sanitizer (tools/gpu_check.sh) the first 10 of the 50
  // windows: racecheck ran past 400 s on the whole curve (H100). Each window
  // is still held to the same bound, and 10 windows still learn (torch's
  // loss falls 4.873 -> 4.507).
  const int64_t windows = std::getenv("ACCRUE_UNDER_SANITIZER") != nullptr
                              ? std::min<int64_t>(fixture_windows, 10)
                              : fixture_windows;
  torch_loss.resize(static_cast<size_t>(windows));
  torch_norm.resize(static_cast<size_t>(windows));

  Gpt2Run run(fixture, cuda_run(DType::bf16, fixture.micro_steps(), schedule_of(torch_run)));
  std::vector<double> loss(windows);
  double worst = 0.0;
  int64_t worst_window = 0;
  std::printf(
      "[gpt2 golden] bf16 compute copy vs torch bf16 autocast (%s), K=%d\n"
      "[gpt2 golden]   window  loss accrue  loss torch  rel diff   norm accrue  norm torch\n",
      torch_run.str("gpu").c_str(), int(fixture.micro_steps()));
  for (int64_t w = 0; w < windows; ++w) {
    const optim::WindowReport r = run.window(w);
    ASSERT_FALSE(r.skipped) << "window " << w;
    loss[w] = r.loss;
    const double diff = relative(r.loss, torch_loss[w]);
    std::printf("[gpt2 golden]   %6d  %11.6f  %10.6f  %8.4f%%  %11.6f  %10.6f\n", int(w), r.loss,
                torch_loss[w], 100.0 * diff, r.grad_norm, torch_norm[w]);
    EXPECT_LE(diff, kBf16LossTol) << "window " << w << ": loss " << r.loss << ", torch "
                                  << torch_loss[w];
    if (!(diff <= worst)) {
      worst = diff;
      worst_window = w;
    }
  }
  // Both learn: accrue's loss falls by at least half as much as torch's.
  const double torch_fall = torch_loss.front() - torch_loss.back();
  EXPECT_GT(torch_fall, 0.0);
  EXPECT_GE(loss.front() - loss.back(), 0.5 * torch_fall);
  std::printf(
      "[gpt2 golden] bf16 over %d windows: loss %.4f -> %.4f (torch %.4f -> %.4f), worst window "
      "%d at %.3f%% (bound %.0f%%)\n",
      int(windows), loss.front(), loss.back(), torch_loss.front(), torch_loss.back(),
      int(worst_window), 100.0 * worst, 100.0 * kBf16LossTol);
}

}  // namespace
}  // namespace accrue::golden
