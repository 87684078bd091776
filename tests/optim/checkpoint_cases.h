// Note [Mid-window checkpoints] as a case run on the CPU
// (tests/optim/optim_test.cpp) and on CUDA (tests/optim/gpu_checkpoint_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/core/tensor_io.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue::test {

inline Device model_device(const nn::MLP& model) {
  return model.parameters().front().device();
}

// Micro-steps [first, k) of a window whose k micro-batches are drawn from
// `seed` (the earlier ones are drawn and dropped, as a data loader that
// resumes mid-window skips them), then the close.
inline void train_window(optim::Window& window, const nn::MLP& model, int64_t k, uint64_t seed,
                         int64_t first = 0, bool close = true) {
  Generator data(seed);
  for (int64_t i = 0; i < k; ++i) {
    Tensor x = randn({5, 6}, DType::f32, Device::cpu(), &data);
    Tensor y = randint(0, 3, {5}, DType::i64, Device::cpu(), &data);
    if (i >= first)
      window.backward(
          cross_entropy(model.forward(x.to(model_device(model))), y.to(model_device(model))));
  }
  if (close) window.close();
}

// Note [Mid-window checkpoints]. Run A: 6 windows of K=3 straight. Run B: 3
// windows and m more micro-steps (m = 0, a window boundary; 1, the middle; 2,
// K-1), save to a safetensors file, load into a fresh model/arena/window
// (different initial weights), finish the window and run to 6. Same bits at
// the end: weights, moments, the window state (scale, N, the noise-scale
// EMAs, measured every window).
inline void checkpoint_resumes_bit_exactly_at_any_micro_step(Device device) {
  auto make = [device](Generator& gen, std::unique_ptr<nn::MLP>& model,
                       std::unique_ptr<optim::ParamStore>& arena,
                       std::unique_ptr<optim::Optimizer>& opt,
                       std::unique_ptr<optim::Window>& window) {
    model = std::make_unique<nn::MLP>(std::vector<int64_t>{6, 12, 3},
                                      nn::ParamOptions{device, DType::f32, &gen});
    opt = std::make_unique<optim::Optimizer>(optim::AdamWOptions(1e-2).weight_decay(0.1));
    arena = std::make_unique<optim::ParamStore>(model->parameters(),
                                                optim::ParamStoreOptions().device(device));
    window = std::make_unique<optim::Window>(
        *arena, *opt,
        optim::WindowOptions()
            .micro_steps(3)
            .max_grad_norm(0.5)
            .scaler(optim::LossScalerOptions::dynamic().growth_interval(2))
            .noise_scale(1));
  };
  Generator ga(5);
  std::unique_ptr<nn::MLP> ma;
  std::unique_ptr<optim::ParamStore> aa;
  std::unique_ptr<optim::Optimizer> oa;
  std::unique_ptr<optim::Window> wa;
  make(ga, ma, aa, oa, wa);
  for (uint64_t w = 0; w < 6; ++w)
    train_window(*wa, *ma, 3, 100 + w);
  for (int64_t m = 0; m < 3; ++m) {
    SCOPED_TRACE("saved after micro-step " + std::to_string(m) + " of window 3");
    Generator gb(5), gc(99);
    std::unique_ptr<nn::MLP> mb, mc;
    std::unique_ptr<optim::ParamStore> ab, ac;
    std::unique_ptr<optim::Optimizer> ob, oc;
    std::unique_ptr<optim::Window> wb, wc;
    make(gb, mb, ab, ob, wb);
    for (uint64_t w = 0; w < 3; ++w)
      train_window(*wb, *mb, 3, 100 + w);
    train_window(*wb, *mb, m, 103, 0, /*close=*/false);  // m micro-steps of window 3
    EXPECT_EQ(wb->micro_step(), m);
    const std::string path =
        (std::filesystem::temp_directory_path() / "accrue_window_checkpoint.safetensors").string();
    const std::map<std::string, Tensor> saved = wb->state_dict();
    EXPECT_EQ(saved.count("grads"), m > 0 ? 1u : 0u);
    save_safetensors(path, saved);
    make(gc, mc, ac, oc, wc);  // different initial weights: the load must replace them
    wc->load_state_dict(load_safetensors(path));
    std::filesystem::remove(path);
    EXPECT_EQ(wc->windows_closed(), 3);
    EXPECT_EQ(wc->micro_step(), m);
    train_window(*wc, *mc, 3, 103, /*first=*/m);
    for (uint64_t w = 4; w < 6; ++w)
      train_window(*wc, *mc, 3, 100 + w);
    EXPECT_TRUE(test::all_equal(ac->master(), aa->master()));
    EXPECT_TRUE(test::all_equal(ac->moment(0), aa->moment(0)));
    EXPECT_TRUE(test::all_equal(ac->moment(1), aa->moment(1)));
    EXPECT_TRUE(test::all_equal(wc->state(), wa->state()));
    EXPECT_EQ(wa->report().loss_scale, wc->report().loss_scale);
    EXPECT_EQ(wa->report().noise_scale, wc->report().noise_scale);
  }
  // The scale grew (growth_interval 2): the scaler state was part of the checkpoint.
  EXPECT_GT(wa->report().loss_scale, 65536.0);
  EXPECT_GT(wa->report().noise_windows, 0);
}

}  // namespace accrue::test
