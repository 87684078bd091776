// GPT-2 against PyTorch, in float64 on the CPU reference backend: a tiny
// nn::GPT2 trained through GradArena + Window (K = 4 micro-batches, clipping,
// AdamW with GPT-2's decay groups, warmup + cosine) follows the run PyTorch
// recorded (tests/golden/make_gpt2_golden.py) window for window, and K
// micro-batches give the update of one large batch.
//
// In f64 both sides round at about 1e-16, so the bounds below (1e-10 against
// torch, 1e-12 between accrue's own K = 4 and K = 1) leave room only for
// rounding: a wrong formula anywhere (attention scale or mask, GELU variant,
// LayerNorm eps, tied-weight gradient, loss normalization, decay groups,
// schedule, clipping) misses by orders of magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "accrue/autograd/variable.h"
#include "accrue/core/tensor_io.h"
#include "tests/golden/gpt2_golden.h"
#include "tests/test_util.h"

namespace accrue::golden {
namespace {

// Against torch: per-window loss and gradient norm (relative), final
// parameters (per parameter, max |a - b| / max |b|).
constexpr double kTorchTol = 1e-10;
// accrue K = 4 against accrue K = 1: the first window's summed gradients and
// the parameters after every window (per parameter, as above).
constexpr double kAccumulationTol = 1e-12;

std::string fixture_path(const std::string& file) {
  return std::string(ACCRUE_GPT2_GOLDEN_DIR) + "/" + file;
}

double relative(double a, double b) {
  return std::fabs(a - b) / std::fabs(b);
}

// max |a - b| / max |b| (NaN anywhere fails).
double slot_max_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

RunOptions cpu_f64(int64_t micro_steps, const Schedule& schedule) {
  RunOptions o;
  o.device = Device::cpu();
  o.master_dtype = o.compute_dtype = DType::f64;
  o.micro_steps = micro_steps;
  o.schedule = schedule;
  return o;
}

TEST(Gpt2GoldenCpu, f64_training_matches_torch) {
  ACCRUE_REQUIRE_GPT2_FIXTURES();
  const Gpt2Fixture fixture(fixture_path("model.safetensors"));
  const FixtureFile torch_run(fixture_path("cpu_f64.safetensors"));
  const int64_t windows = torch_run.integer("windows");
  const std::vector<double> torch_loss = torch_run.tensor("loss").to_vector<double>();
  const std::vector<double> torch_norm = torch_run.tensor("grad_norm").to_vector<double>();
  ASSERT_EQ(static_cast<int64_t>(torch_loss.size()), windows);
  ASSERT_EQ(static_cast<int64_t>(torch_norm.size()), windows);
  ASSERT_LE(windows, fixture.token_windows());

  const double max_norm = fixture.file().number("max_grad_norm");
  Gpt2Run run(fixture, cpu_f64(fixture.micro_steps(), schedule_of(torch_run)));
  double worst_loss = 0.0, worst_norm = 0.0;
  int clipped = 0;
  std::printf(
      "[gpt2 golden] cpu f64, K=%d: window, loss (accrue, torch), grad norm (accrue, torch)\n",
      int(fixture.micro_steps()));
  for (int64_t w = 0; w < windows; ++w) {
    const optim::WindowReport r = run.window(w);
    ASSERT_FALSE(r.skipped) << "window " << w;
    EXPECT_EQ(r.items, double(fixture.sequences() * fixture.seq_len())) << "window " << w;
    std::printf("[gpt2 golden]   %2d  %.15f %.15f  %.15f %.15f\n", int(w), r.loss, torch_loss[w],
                r.grad_norm, torch_norm[w]);
    EXPECT_LE(relative(r.loss, torch_loss[w]), kTorchTol)
        << "window " << w << ": loss " << r.loss << ", torch " << torch_loss[w];
    EXPECT_LE(relative(r.grad_norm, torch_norm[w]), kTorchTol)
        << "window " << w << ": grad norm " << r.grad_norm << ", torch " << torch_norm[w];
    // Clipping happens exactly when torch's norm exceeds max_grad_norm.
    EXPECT_EQ(r.clip_coef<1.0, torch_norm[w]> max_norm) << "window " << w;
    worst_loss = std::max(worst_loss, relative(r.loss, torch_loss[w]));
    worst_norm = std::max(worst_norm, relative(r.grad_norm, torch_norm[w]));
    clipped += r.clip_coef < 1.0;
  }
  // The loss falls (the Markov-chain data is learnable) and clipping took part.
  EXPECT_LT(torch_loss.back(), torch_loss.front());
  EXPECT_GT(clipped, 0) << "no window clipped: the fixture no longer tests clipping";

  double worst_param = 0.0;
  std::string worst_name;
  for (const nn::NamedParameter& p : run.model().named_parameters()) {
    const std::vector<double> expected = torch_run.tensor("final." + p.name).to_vector<double>();
    const double err = slot_max_error(run.master(p.name), expected);
    EXPECT_LE(err, kTorchTol) << "final " << p.name;
    if (err >= worst_param) {
      worst_param = err;
      worst_name = p.name;
    }
  }
  std::printf(
      "[gpt2 golden] cpu f64 vs torch f64 over %d windows (%d clipped): loss %.3g, grad norm "
      "%.3g (relative), final parameters %.3g (max|a-b|/max|b|, worst %s); bound %.0e\n",
      int(windows), clipped, worst_loss, worst_norm, worst_param, worst_name.c_str(), kTorchTol);
}

// K = 4 micro-batches of 4 sequences against K = 1 batch of 16, both accrue,
// same data: the same summed gradient after the first window and the same
// parameters after every window (Note [Normalization] in optim/window.h: the
// window divides by its item count once).
TEST(Gpt2GoldenCpu, micro_batches_equal_one_large_batch) {
  ACCRUE_REQUIRE_GPT2_FIXTURES();
  const Gpt2Fixture fixture(fixture_path("model.safetensors"));
  const FixtureFile torch_run(fixture_path("cpu_f64.safetensors"));
  const int64_t windows = torch_run.integer("windows");
  const Schedule schedule = schedule_of(torch_run);
  ASSERT_GT(fixture.micro_steps(), 1);

  Gpt2Run micro(fixture, cpu_f64(fixture.micro_steps(), schedule));
  Gpt2Run large(fixture, cpu_f64(1, schedule));
  double worst_grad = 0.0, worst_param = 0.0, worst_loss = 0.0;
  for (int64_t w = 0; w < windows; ++w) {
    const optim::WindowReport a = micro.window(w);
    const optim::WindowReport b = large.window(w);
    worst_loss = std::max(worst_loss, relative(a.loss, b.loss));
    EXPECT_LE(relative(a.loss, b.loss), kAccumulationTol) << "window " << w;
    EXPECT_LE(relative(a.grad_norm, b.grad_norm), kAccumulationTol) << "window " << w;
    EXPECT_EQ(a.items, b.items) << "window " << w;
    if (w == 0) {
      // The raw summed gradients (the arena before the coefficient), slot by slot.
      for (size_t i = 0; i < micro.arena().size(); ++i) {
        const double err = slot_max_error(micro.arena().grad_view(i).to_vector<double>(),
                                          large.arena().grad_view(i).to_vector<double>());
        EXPECT_LE(err, kAccumulationTol)
            << "window 0 gradient of " << micro.arena().slots()[i].name;
        worst_grad = std::max(worst_grad, err);
      }
    }
    for (const nn::NamedParameter& p : micro.model().named_parameters()) {
      const double err = slot_max_error(micro.master(p.name), large.master(p.name));
      EXPECT_LE(err, kAccumulationTol) << "window " << w << " parameter " << p.name;
      worst_param = std::max(worst_param, err);
    }
  }
  std::printf(
      "[gpt2 golden] cpu f64 K=%d x %d sequences vs K=1 x %d: window-1 gradients %.3g, "
      "parameters over %d windows %.3g (max|a-b|/max|b| per parameter), loss %.3g; bound %.0e\n",
      int(fixture.micro_steps()), int(fixture.micro_batch()), int(fixture.sequences()), worst_grad,
      int(windows), worst_param, worst_loss, kAccumulationTol);
}

// A fixture that does not fit the model fails with an error that names the
// file and the weight, never a crash or a silent partial load. Runs without
// the fixtures: it writes its own small file.
TEST(Gpt2FixtureCpu, malformed_fixture_is_named) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "accrue_gpt2_golden_malformed.safetensors")
          .string();
  const std::map<std::string, std::string> meta = {
      {"n_layer", "1"},     {"n_head", "2"},      {"n_embd", "8"},
      {"block_size", "4"},  {"vocab_size", "16"}, {"padded_vocab_size", "16"},
      {"dropout", "0.0"},   {"seq_len", "4"},     {"micro_batch", "1"},
      {"micro_steps", "2"}, {"ln_eps", "1e-05"}};
  const Tensor tokens = zeros({1, 2, 5}, DType::i64);

  // Every weight but wpe; wte misshapen.
  Generator gen(1);
  nn::GPT2Config config;
  config.n_layer = 1;
  config.n_head = 2;
  config.n_embd = 8;
  config.block_size = 4;
  config.vocab_size = 16;
  config.padded_vocab_size = 16;
  config.dropout = 0.0;
  const nn::GPT2 reference(config, nn::ParamOptions{Device::cpu(), DType::f32, &gen});
  std::map<std::string, Tensor> tensors = {{"tokens", tokens}};
  for (const nn::NamedParameter& p : reference.named_parameters()) {
    if (p.name != "wpe") tensors["init." + p.name] = detach(p.tensor).clone();
  }
  save_safetensors(path, tensors, meta);
  EXPECT_ERROR(make_model(Gpt2Fixture(path), Device::cpu(), DType::f64), path.c_str(), "init.wpe");

  tensors["init.wpe"] = zeros({4, 8});
  tensors["init.wte"] = zeros({8, 16});  // transposed
  save_safetensors(path, tensors, meta);
  EXPECT_ERROR(make_model(Gpt2Fixture(path), Device::cpu(), DType::f64), "init.wte", "[8, 16]",
               "[16, 8]");

  tensors["tokens"] = zeros({1, 2, 4}, DType::i64);  // seq_len + 1 = 5 expected
  save_safetensors(path, tensors, meta);
  EXPECT_ERROR(Gpt2Fixture{path}, "tokens", "[1, 2, 4]", "[windows, 2, 5]");

  std::map<std::string, std::string> no_layers = meta;
  no_layers.erase("n_layer");
  tensors["tokens"] = tokens;
  save_safetensors(path, tensors, no_layers);
  EXPECT_ERROR(Gpt2Fixture(path).config(), "no metadata 'n_layer'");

  std::filesystem::remove(path);
  EXPECT_ERROR(Gpt2Fixture{path}, path.c_str(), "is missing");
}

}  // namespace
}  // namespace accrue::golden
