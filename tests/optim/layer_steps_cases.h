// Note [Close under the forward] and Note [Step ranges] as cases run on the
// CPU (tests/optim/layer_steps_test.cpp: the close's steps at once, or in the
// test mode that steps each range only when a read awaits it) and on CUDA
// (tests/optim/gpu_layer_steps_test.cpp: the ranges on a side stream beside
// the next forward). Every case compares with the sequential close, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/nn/gpt2.h"
#include "accrue/nn/llama.h"
#include "accrue/nn/resnet.h"
#include "accrue/optim/graphed_window.h"
#include "accrue/optim/layer_steps.h"
#include "accrue/optim/window.h"
#include "tests/optim/same_reports.h"
#include "tests/test_util.h"

namespace accrue::test {

enum class CloseModel { gpt2, llama, mlp, resnet };

// A small model trained with AdamW in two groups, a warmup-cosine LR (every
// window's rate differs), clipping and a dynamic loss scale that starts too
// high, so that window 0 overflows and is skipped (Note [Skipped window]);
// `options` adds the close's mode to that.
struct CloseRun {
  static constexpr int64_t kVocab = 128, kT = 16, kB = 2;
  CloseModel kind;
  Device device;
  DType compute_dtype;  // the ParamStore's; the features' dtype too
  std::unique_ptr<nn::GPT2> gpt2;
  std::unique_ptr<nn::Llama> llama;
  std::unique_ptr<nn::MLP> mlp;
  std::unique_ptr<nn::ResNet> resnet;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::ParamStore> store;
  std::unique_ptr<optim::Window> window;

  // fp8: GPT-2's blocks in FP8 with the store's copies (Note [Window FP8 weights]).
  CloseRun(CloseModel k, Device d, DType compute, const optim::WindowOptions& options,
           std::optional<Fp8Recipe> fp8 = std::nullopt)
      : kind(k), device(d), compute_dtype(compute) {
    Generator gen(11);
    const nn::ParamOptions po{device, DType::f32, &gen};
    if (kind == CloseModel::gpt2) {
      nn::GPT2Config c;
      c.n_layer = 2;
      c.n_head = 4;
      c.n_embd = 64;
      c.block_size = kT;
      c.vocab_size = kVocab;
      gpt2 = std::make_unique<nn::GPT2>(c, po);
    } else if (kind == CloseModel::llama) {
      nn::LlamaConfig c = nn::LlamaConfig::llama_tiny();
      c.vocab_size = kVocab;
      llama = std::make_unique<nn::Llama>(c, po);
    } else if (kind == CloseModel::mlp) {
      mlp = std::make_unique<nn::MLP>(std::vector<int64_t>{kT, 96, 64, kVocab}, po);
    } else {
      nn::ResNetConfig c;  // bottleneck blocks, a downsampling shortcut, BatchNorm
      c.bottleneck = true;
      c.blocks = {1, 1};
      c.width = 4;
      c.in_channels = 1;
      c.num_classes = kVocab;
      c.small_input = true;
      resnet = std::make_unique<nn::ResNet>(c, po);
    }
    const std::vector<nn::NamedParameter> params = module().named_parameters();
    optimizer = std::make_unique<optim::Optimizer>(optim::AdamWOptions(3e-3).weight_decay(0.1));
    std::vector<Tensor> no_decay;
    for (const nn::NamedParameter& p : params)
      if (p.tensor.dim() < 2) no_decay.push_back(p.tensor);
    optimizer->add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
    optimizer->set_schedule(std::make_shared<optim::WarmupCosine>(1, 8, 0.1));
    store = std::make_unique<optim::ParamStore>(
        params, optim::ParamStoreOptions().device(device).compute_dtype(compute).moments(
                    optimizer->moments_needed()));
    if (fp8) {
      ACCRUE_CHECK(gpt2 != nullptr, "CloseRun: FP8 is GPT-2's here");
      Fp8LinearOptions f;
      f.recipe = *fp8;
      store->keep_fp8_copies(gpt2->use_fp8(f), DType::f8e4m3, 0, *fp8);
    }
    optim::WindowOptions o = options;
    o.max_grad_norm(0.5).scaler(optim::LossScalerOptions::dynamic()
                                    .max_scale(1e300)
                                    .init_scale(1e300)
                                    .backoff_factor(1e-296)
                                    .growth_interval(2));
    window = std::make_unique<optim::Window>(*store, *optimizer, o);
    initial = store->master().clone();
  }
  Tensor initial;  // the master weights before training

  const nn::Module& module() const {
    if (gpt2) return *gpt2;
    if (llama) return *llama;
    if (resnet) return *resnet;
    return *mlp;
  }

  // Micro-batch (w, k): tokens and a fixed map of them the model can learn.
  std::vector<Tensor> inputs(int64_t w, int64_t k) const {
    Generator data(500 + 31 * static_cast<uint64_t>(w) + static_cast<uint64_t>(k));
    const Tensor x = randint(0, kVocab, {kB, kT}, DType::i64, Device::cpu(), &data);
    std::vector<int64_t> t = x.to_vector<int64_t>();
    for (int64_t& v : t)
      v = (3 * v + 1) % kVocab;
    return {x.to(device), from_vector<int64_t>(t, {kB, kT}).to(device)};
  }
  Loss loss_of(const std::vector<Tensor>& in) const {
    if (gpt2) return gpt2->loss(in[0], in[1]);
    if (llama) return llama->loss(in[0], in[1], nn::BatchLayout::full());
    // The MLP reads each row's tokens as features, the ResNet as a 4 x 4
    // image of one channel; both predict the first target.
    const Tensor features = in[0].to(compute_dtype);
    const Tensor target = in[1].narrow(1, 0, 1).reshape({kB});
    if (resnet) return cross_entropy(resnet->forward(reshape(features, {kB, 1, 4, 4})), target);
    return cross_entropy(mlp->forward(features), target);
  }
  Loss loss(int64_t w, int64_t k) const { return loss_of(inputs(w, k)); }

  std::vector<optim::WindowReport> train(int64_t windows, int64_t K) {
    std::vector<optim::WindowReport> reports;
    for (int64_t w = 0; w < windows; ++w) {
      for (int64_t k = 0; k < K; ++k)
        window->backward(loss(w, k));
      window->close();
      reports.push_back(window->report());
    }
    return reports;
  }
};

inline optim::WindowOptions sequential_close(int64_t K) {
  return optim::WindowOptions().micro_steps(K);
}

inline optim::WindowOptions close_under_forward(int64_t K, int64_t min_elements, bool lazy,
                                                int64_t max_blocks = 0) {
  return optim::WindowOptions()
      .micro_steps(K)
      .close_under_forward(true, min_elements, max_blocks)
      .close_steps_on_first_read(lazy);
}

// Same bits: weights, moments, compute copy, every window's report, and the
// window checkpoint (taken while the last close's steps may be pending).
inline void expect_same_run(CloseRun& a, const std::vector<optim::WindowReport>& ra, CloseRun& b,
                            const std::vector<optim::WindowReport>& rb) {
  const std::map<std::string, Tensor> da = a.window->state_dict(), db = b.window->state_dict();
  ASSERT_EQ(da.size(), db.size());
  for (const auto& [key, value] : da) {
    SCOPED_TRACE(key);
    ASSERT_EQ(db.count(key), 1u);
    EXPECT_TRUE(all_equal(db.at(key), value));
  }
  EXPECT_TRUE(all_equal(b.store->master(), a.store->master()));
  if (a.store->compute().defined()) {
    EXPECT_TRUE(all_equal(b.store->compute(), a.store->compute()));
  }
  expect_same_reports(ra, rb);
  // Window 0 overflowed at the huge first scale and was skipped; the others
  // stepped, so this compares two runs whose weights moved.
  EXPECT_TRUE(ra.front().skipped);
  EXPECT_GE(ra.back().optimizer_steps, 2);
  EXPECT_FALSE(all_equal(a.store->master(), a.initial));
}

// Trains `kind` with the sequential close and with the close under the
// forward (ranges of at least min_elements; lazy: the test mode), and
// compares them.
inline void expect_close_under_forward_is_bitwise(CloseModel kind, Device device, DType compute,
                                                  int64_t min_elements, bool lazy,
                                                  std::optional<Fp8Recipe> fp8 = std::nullopt,
                                                  int64_t max_blocks = 0) {
  constexpr int64_t kWindows = 5, kK = 2;
  CloseRun a(kind, device, compute, sequential_close(kK), fp8);
  CloseRun b(kind, device, compute, close_under_forward(kK, min_elements, lazy, max_blocks), fp8);
  const std::vector<optim::WindowReport> ra = a.train(kWindows, kK);
  const std::vector<optim::WindowReport> rb = b.train(kWindows, kK);
  expect_same_run(a, ra, b, rb);
  EXPECT_NE(b.window->describe_close().find("layer steps"), std::string::npos);
  EXPECT_EQ(b.window->describe_close().find("optimizer step"), std::string::npos);
}

// The same through a GraphedWindow: micro-steps captured and replayed (their
// waits as event-wait nodes), the close eager beside the next forward.
inline void expect_graphed_close_under_forward_is_bitwise(CloseModel kind, Device device,
                                                          DType compute, int64_t min_elements) {
  constexpr int64_t kWindows = 6, kK = 2;
  CloseRun a(kind, device, compute, sequential_close(kK));
  CloseRun b(kind, device, compute, close_under_forward(kK, min_elements, /*lazy=*/false));
  const std::vector<optim::WindowReport> ra = a.train(kWindows, kK);
  optim::GraphedWindow graphed(*b.window,
                               [&b](const std::vector<Tensor>& in) { return b.loss_of(in); });
  std::vector<optim::WindowReport> rb;
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t k = 0; k < kK; ++k)
      graphed.backward(b.inputs(w, k));
    graphed.close();
    rb.push_back(b.window->report());
  }
  expect_same_run(a, ra, b, rb);
  // On CUDA both phases run eagerly once, then from graphs (Note [Graphed
  // window]); every close is eager. On the CPU everything is.
  const int64_t eager = device.is_cuda() ? 2 : kWindows * kK;
  EXPECT_EQ(graphed.counts().eager_micro_steps, eager);
  EXPECT_EQ(graphed.counts().replayed_micro_steps, kWindows * kK - eager);
  EXPECT_EQ(graphed.counts().eager_closes, kWindows);
}

}  // namespace accrue::test
