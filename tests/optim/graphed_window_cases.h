// Note [Graphed window] as cases run on the CPU (tests/optim/optim_test.cpp:
// every call eager, bitwise a plain Window) and on CUDA
// (tests/optim/gpu_graphed_window_test.cpp: micro-steps and closes replayed
// from graphs, bitwise the eager run on the same GPU).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/nn/gpt2.h"
#include "accrue/optim/graphed_window.h"
#include "tests/optim/same_reports.h"
#include "tests/test_util.h"

namespace accrue::test {

// The decoder blocks' projections: as the model makes them, or FP8 with the
// weights' copies kept (Note [Window FP8 weights]) and current or delayed
// scaling (Note [FP8 delayed scaling]); current_codes_apart keeps the codes
// out of the compute slots (Note [FP8 codes in the compute slots]).
enum class Fp8Mode { off, current, delayed, current_codes_apart };

// A two-layer GPT-2 trained with AdamW in two groups, a warmup-cosine LR
// (so that every window's learning rate differs: Note [Hyperparameters on
// the device]) and clipping, on `device` with a `compute` copy.
struct GraphedGPT2 {
  static constexpr int64_t kVocab = 128, kT = 32;
  std::unique_ptr<nn::GPT2> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::ParamStore> arena;
  std::unique_ptr<optim::Window> window;
  Device device;

  GraphedGPT2(Device d, DType compute, int64_t K, double dropout = 0.0,
              bool close_under_forward = false, Fp8Mode fp8 = Fp8Mode::off)
      : device(d) {
    nn::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.block_size = kT;
    c.vocab_size = kVocab;
    c.dropout = dropout;
    Generator gen(7);
    model = std::make_unique<nn::GPT2>(c, nn::ParamOptions{device, DType::f32, &gen});
    optimizer = std::make_unique<optim::Optimizer>(optim::AdamWOptions(3e-3).weight_decay(0.1));
    std::vector<Tensor> no_decay;
    for (const nn::NamedParameter& p : model->named_parameters())
      if (p.tensor.dim() < 2) no_decay.push_back(p.tensor);
    optimizer->add_param_group(no_decay, optim::GroupOptions().weight_decay(0.0));
    optimizer->set_schedule(std::make_shared<optim::WarmupCosine>(1, 6, 0.1));
    arena = std::make_unique<optim::ParamStore>(
        model->named_parameters(),
        optim::ParamStoreOptions()
            .device(device)
            .compute_dtype(compute)
            .moments(optimizer->moments_needed())
            .fp8_codes_in_compute_slots(fp8 != Fp8Mode::current_codes_apart));
    if (fp8 != Fp8Mode::off) {
      const std::vector<Tensor> weights = model->use_fp8(Fp8LinearOptions{});
      arena->keep_fp8_copies(weights);
      if (fp8 == Fp8Mode::delayed) arena->keep_fp8_delayed_scaling(weights);
    }
    window = std::make_unique<optim::Window>(
        *arena, *optimizer,
        optim::WindowOptions().micro_steps(K).max_grad_norm(0.5).close_under_forward(
            close_under_forward, 1));
  }

  // The micro-batch of (window w, micro-step k): B sequences of tokens.
  std::vector<Tensor> batch(int64_t w, int64_t k, int64_t B) const {
    Generator data(1000 + 31 * static_cast<uint64_t>(w) + static_cast<uint64_t>(k));
    Tensor x = randint(0, kVocab, {B, kT}, DType::i64, Device::cpu(), &data);
    // A target the model can learn (a fixed map of the input token), so
    // that the loss falls over the run.
    std::vector<int64_t> targets = x.to_vector<int64_t>();
    for (int64_t& t : targets)
      t = (3 * t + 1) % kVocab;
    Tensor y = from_vector<int64_t>(targets, {B, kT});
    return {x.to(device), y.to(device)};
  }
  optim::GraphedWindow::StepFn step() const {
    return [m = model.get()](const std::vector<Tensor>& in) { return m->loss(in[0], in[1]); };
  }
};

// Micro-batch sizes: B everywhere, except `odd_b` at (odd_w, odd_k) when odd_b > 0.
// `concurrent`: the graphed window's micro-steps in flight (Note [Concurrent
// micro-batches]); `branch_lag` > 0: the weight-gradient branch with that lag
// (Note [Weight gradients on a branch]).
struct Schedule {
  int64_t windows = 4, K = 3, B = 4;
  int concurrent = 1;
  int branch_lag = 0;
  Fp8Mode fp8 = Fp8Mode::off;
  int64_t odd_w = -1, odd_k = -1, odd_b = 0;
  int64_t b(int64_t w, int64_t k) const { return w == odd_w && k == odd_k ? odd_b : B; }
};

inline std::vector<optim::WindowReport> train_eager(GraphedGPT2& run, const Schedule& s) {
  std::vector<optim::WindowReport> reports;
  for (int64_t w = 0; w < s.windows; ++w) {
    for (int64_t k = 0; k < s.K; ++k) {
      const std::vector<Tensor> in = run.batch(w, k, s.b(w, k));
      run.window->backward(run.model->loss(in[0], in[1]));
    }
    run.window->close();
    reports.push_back(run.window->report());
  }
  return reports;
}

inline std::vector<optim::WindowReport> train_graphed(GraphedGPT2& run, optim::GraphedWindow& g,
                                                      const Schedule& s) {
  std::vector<optim::WindowReport> reports;
  for (int64_t w = 0; w < s.windows; ++w) {
    for (int64_t k = 0; k < s.K; ++k)
      g.backward(run.batch(w, k, s.b(w, k)));
    EXPECT_TRUE(g.ready());
    g.close();
    reports.push_back(run.window->report());
  }
  return reports;
}

// Same bits: weights, moments, compute copy, and every window's report.
inline void expect_same_run(const GraphedGPT2& a, const std::vector<optim::WindowReport>& ra,
                            const GraphedGPT2& b, const std::vector<optim::WindowReport>& rb) {
  EXPECT_TRUE(all_equal(b.arena->master(), a.arena->master()));
  EXPECT_TRUE(all_equal(b.arena->moment(0), a.arena->moment(0)));
  EXPECT_TRUE(all_equal(b.arena->moment(1), a.arena->moment(1)));
  if (a.arena->compute().defined()) {
    EXPECT_TRUE(all_equal(b.arena->compute(), a.arena->compute()));
  }
  if (const optim::Fp8DelayedScaling* fa = a.arena->fp8_delayed_scaling()) {
    EXPECT_TRUE(all_equal(b.arena->fp8_delayed_scaling()->x_state(), fa->x_state()));
    EXPECT_TRUE(all_equal(b.arena->fp8_delayed_scaling()->dy_state(), fa->dy_state()));
  }
  expect_same_reports(ra, rb);
  for (const optim::WindowReport& r : rb)
    EXPECT_FALSE(r.skipped);
  // The run learned something, so the comparison is not of two idle runs.
  EXPECT_LT(ra.back().loss, ra.front().loss);
}

// Runs the eager and the graphed training of `s` and compares them; returns
// the graphed window's counts, what it printed on stderr and the branch's
// entries (Note [Weight gradients on a branch]).
struct GraphedOutcome {
  optim::GraphedWindow::Counts counts;
  std::string warnings;
  int64_t branch_entries = 0;
};
inline GraphedOutcome graphed_matches_eager(Device device, DType compute, const Schedule& s,
                                            double dropout = 0.0) {
  GraphedGPT2 eager(device, compute, s.K, dropout, false, s.fp8),
      graphed(device, compute, s.K, dropout, false, s.fp8);
  const std::vector<optim::WindowReport> ra = train_eager(eager, s);
  ::testing::internal::CaptureStderr();
  optim::GraphedWindow g(*graphed.window, graphed.step());
  g.set_concurrent_micro_batches(s.concurrent);
  g.set_weight_grad_branch(s.branch_lag);
  const std::vector<optim::WindowReport> rb = train_graphed(graphed, g, s);
  GraphedOutcome out{g.counts(), ::testing::internal::GetCapturedStderr(),
                     g.weight_grad_branch_entries()};
  expect_same_run(eager, ra, graphed, rb);
  EXPECT_EQ(out.counts.replayed_micro_steps + out.counts.eager_micro_steps, s.windows * s.K);
  EXPECT_EQ(out.counts.replayed_closes + out.counts.eager_closes, s.windows);
  return out;
}

// Note [FP8 codes in the compute slots]: a bf16 GPT-2 whose FP8 codes live
// in the compute slots trains the bits of one whose codes are kept apart,
// with the close in one pass and under the forward, in less memory.
inline void fp8_codes_in_slots_train_as_codes_apart(Device device) {
  Schedule s;
  s.windows = 3;
  GraphedGPT2 apart(device, DType::bf16, s.K, 0.0, false, Fp8Mode::current_codes_apart);
  EXPECT_FALSE(apart.arena->memory().fp8_in_compute);
  const std::vector<optim::WindowReport> ra = train_eager(apart, s);
  for (bool under : {false, true}) {
    SCOPED_TRACE(under ? "close under the forward" : "close in one pass");
    GraphedGPT2 in(device, DType::bf16, s.K, 0.0, under, Fp8Mode::current);
    EXPECT_TRUE(in.arena->memory().fp8_in_compute);
    EXPECT_LT(in.arena->memory().total(), apart.arena->memory().total());
    const std::vector<optim::WindowReport> rb = train_eager(in, s);
    EXPECT_TRUE(all_equal(in.arena->master(), apart.arena->master()));
    EXPECT_TRUE(all_equal(in.arena->moment(0), apart.arena->moment(0)));
    EXPECT_TRUE(all_equal(in.arena->moment(1), apart.arena->moment(1)));
    expect_same_reports(ra, rb);
  }
  EXPECT_LT(ra.back().loss, ra.front().loss);
}

// Bad use is an accrue::Error naming what is wrong.
inline void graphed_window_refuses_bad_use(Device device) {
  GraphedGPT2 run(device, DType::f32, 2);
  EXPECT_ERROR(optim::GraphedWindow(*run.window, nullptr), "GraphedWindow",
               "step function is empty");
  optim::GraphedWindow g(*run.window, run.step());
  EXPECT_ERROR(g.backward({run.batch(0, 0, 2)[0], Tensor()}), "GraphedWindow::backward",
               "input 1 is an undefined tensor");
  EXPECT_ERROR(g.close(), "GraphedWindow::close", "0 of 2 micro-steps done");
  g.backward(run.batch(0, 0, 2));
  g.backward(run.batch(0, 1, 2));
  EXPECT_ERROR(g.backward(run.batch(0, 2, 2)), "Window::backward", "already has its 2");
  g.close();
  EXPECT_EQ(run.window->windows_closed(), 1);
  // Note [Concurrent micro-batches]: the option is set before the first
  // backward, to n >= 1, and not beside what it cannot order.
  EXPECT_ERROR(g.set_concurrent_micro_batches(2), "set_concurrent_micro_batches",
               "before the first backward");
  optim::GraphedWindow fresh(*run.window, run.step());
  EXPECT_ERROR(fresh.set_concurrent_micro_batches(0), "set_concurrent_micro_batches",
               "n must be >= 1, got 0");
  GraphedGPT2 under(device, DType::f32, 2, 0.0, /*close_under_forward=*/true);
  optim::GraphedWindow g_under(*under.window, under.step());
  EXPECT_ERROR(g_under.set_concurrent_micro_batches(2), "set_concurrent_micro_batches(2)",
               "not with close_under_forward");
  g_under.set_concurrent_micro_batches(1);  // one at a time is always allowed
  // Note [Weight gradients on a branch]: before the first backward, lag >= 0,
  // and not with concurrent micro-batches (either way round); 0 turns it off.
  EXPECT_ERROR(g.set_weight_grad_branch(2), "set_weight_grad_branch", "before the first backward");
  EXPECT_ERROR(fresh.set_weight_grad_branch(-1), "set_weight_grad_branch",
               "lag must be >= 0 (0: off), got -1");
  fresh.set_concurrent_micro_batches(2);
  EXPECT_ERROR(fresh.set_weight_grad_branch(2), "set_weight_grad_branch(2)",
               "not with 2 concurrent micro-batches");
  fresh.set_concurrent_micro_batches(1);
  fresh.set_weight_grad_branch(3);
  EXPECT_EQ(fresh.weight_grad_branch(), 3);
  EXPECT_ERROR(fresh.set_concurrent_micro_batches(2), "set_concurrent_micro_batches(2)",
               "not with the weight-gradient branch");
  fresh.set_weight_grad_branch(0);
  EXPECT_EQ(fresh.weight_grad_branch(), 0);
  // Beside a GradientSync (here one that does nothing), both are refused:
  // its all-reduces launch from host hooks that sit on every parameter.
  struct OneRank : optim::GradientSync {
    void before_backward(int64_t, int64_t) override {}
    void finish(const Tensor&) override {}
  } one_rank;
  GraphedGPT2 synced(device, DType::f32, 2);
  optim::Window synced_window(*synced.arena, *synced.optimizer,
                              optim::WindowOptions().micro_steps(2), &one_rank);
  optim::GraphedWindow g_synced(synced_window, synced.step());
  EXPECT_ERROR(g_synced.set_weight_grad_branch(1), "set_weight_grad_branch(1)",
               "not with a GradientSync");
  EXPECT_ERROR(g_synced.set_concurrent_micro_batches(2), "set_concurrent_micro_batches(2)",
               "not with a GradientSync");
}

}  // namespace accrue::test
