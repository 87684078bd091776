// Optimizer options, schedules, the loss scaler's options and the Window's
// contract: validation, misuse errors and checkpoints that resume bit-exactly.
#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "accrue/autograd/ops.h"
#include "accrue/core/tensor_io.h"
#include "accrue/kernels/window_close.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/optim/checkpoint_cases.h"
#include "tests/optim/graphed_window_cases.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using ::testing::HasSubstr;

TEST(OptimizerOptions, invalid_arguments_are_errors_naming_the_value) {
  EXPECT_ERROR(optim::Optimizer(optim::AdamWOptions(-1e-3)), "AdamW", "learning rate", "-0.001");
  EXPECT_ERROR(optim::Optimizer(optim::AdamWOptions(1e-3).betas(1.0, 0.999)), "AdamW", "beta1",
               "1");
  EXPECT_ERROR(optim::Optimizer(optim::AdamOptions(1e-3).betas(0.9, -0.1)), "Adam", "beta2");
  EXPECT_ERROR(optim::Optimizer(optim::AdamOptions(1e-3).eps(-1.0)), "Adam", "eps");
  EXPECT_ERROR(optim::Optimizer(optim::AdamWOptions(1e-3).weight_decay(NAN)), "weight_decay");
  EXPECT_ERROR(optim::Optimizer(optim::SGDOptions(0.1).nesterov(true)), "SGD", "nesterov");
  EXPECT_ERROR(optim::Optimizer(optim::SGDOptions(0.1).momentum(-0.5)), "SGD", "momentum");
  EXPECT_ERROR(optim::Optimizer(optim::SGDOptions(INFINITY)), "SGD", "learning rate");
}

TEST(OptimizerOptions, defaults_follow_pytorch) {
  EXPECT_EQ(optim::AdamWOptions(1e-3).weight_decay(), 0.01);
  EXPECT_EQ(optim::AdamOptions(1e-3).weight_decay(), 0.0);
  EXPECT_EQ(optim::AdamOptions(1e-3).beta2(), 0.999);
  EXPECT_EQ(optim::AdamOptions(1e-3).eps(), 1e-8);
  optim::Optimizer o(optim::AdamWOptions(1e-3).amsgrad(true));
  EXPECT_EQ(o.moments_needed(), 3);
  EXPECT_EQ(optim::Optimizer(optim::SGDOptions(0.1)).moments_needed(), 0);
  EXPECT_EQ(optim::Optimizer(optim::SGDOptions(0.1).momentum(0.9)).moments_needed(), 1);
}

TEST(Schedules, warmup_cosine_and_linear_scaling) {
  optim::LinearWarmup warm(4);
  EXPECT_DOUBLE_EQ(warm.factor(0), 0.25);
  EXPECT_DOUBLE_EQ(warm.factor(3), 1.0);
  EXPECT_DOUBLE_EQ(warm.factor(100), 1.0);
  optim::WarmupCosine cos(2, 12, 0.1);
  EXPECT_DOUBLE_EQ(cos.factor(0), 0.5);
  EXPECT_DOUBLE_EQ(cos.factor(2), 1.0);
  EXPECT_NEAR(cos.factor(7), 0.1 + 0.9 * 0.5, 1e-15);  // halfway through the decay
  EXPECT_DOUBLE_EQ(cos.factor(12), 0.1);
  EXPECT_DOUBLE_EQ(optim::linear_scaling_rule(0.1, 256, 1024), 0.4);
  EXPECT_ERROR(optim::WarmupCosine(10, 5), "WarmupCosine");
  EXPECT_ERROR(optim::linear_scaling_rule(0.1, 0, 8), "linear_scaling_rule");
  // The schedule scales every group's lr.
  optim::Optimizer o(optim::AdamWOptions(1.0));
  o.add_param_group({}, optim::GroupOptions().lr(0.5).weight_decay(0.0));
  o.set_schedule(std::make_shared<optim::LinearWarmup>(2));
  const kernels::OptimizerConfig c = o.config_at(0);
  ASSERT_EQ(c.groups.size(), 2u);
  EXPECT_DOUBLE_EQ(c.groups[0].lr, 0.5);
  EXPECT_DOUBLE_EQ(c.groups[1].lr, 0.25);
  EXPECT_DOUBLE_EQ(c.groups[1].weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.groups[0].weight_decay, 0.01);
}

TEST(LossScaler, options_are_validated) {
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().growth_factor(0.5).validate(), "growth_factor");
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().backoff_factor(1.5).validate(),
               "backoff_factor");
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().growth_interval(0).validate(),
               "growth_interval");
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().init_scale(1e9).validate(), "init_scale");
  EXPECT_ERROR(optim::LossScalerOptions::fixed(-2.0), "init_scale");
  EXPECT_EQ(optim::LossScalerOptions::dynamic().init_scale(), 65536.0);
  // No cap is a valid choice (Note [Option checks]); a cap below the floor is not.
  EXPECT_NO_THROW(optim::LossScalerOptions::dynamic().max_scale(INFINITY).validate());
  EXPECT_ERROR(optim::LossScalerOptions::dynamic().min_scale(8.0).max_scale(4.0).validate(),
               "LossScaler", "max_scale = 4", "min_scale = 8");
  EXPECT_EQ(optim::LossScalerOptions::dynamic().config().growth_interval, 2000);
}

// README "Differences from PyTorch": a parameter no gradient reached in a
// window is stepped with a zero gradient (Note [Overwrite first]), where
// PyTorch's zero_grad(set_to_none=True) would leave it alone: AdamW's
// decoupled decay still shrinks it, and the one step count advances.
// Note [Graphed window]: graphs are CUDA's, so on the CPU every call is the
// plain Window's, silently.
TEST(GraphedWindow, on_the_cpu_every_call_is_eager_and_equals_a_plain_window) {
  test::Schedule s;
  s.windows = 3;
  s.K = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(Device::cpu(), DType::f32, s);
  EXPECT_EQ(out.counts.eager_micro_steps, 6);
  EXPECT_EQ(out.counts.eager_closes, 3);
  EXPECT_EQ(out.counts.graphs, 0);
  EXPECT_EQ(out.warnings, "");
}

// Note [FP8 delayed scaling]: the GPT-2 of the graphed cases with its
// projections in FP8 and delayed scaling, on the CPU, equals a plain Window
// bit for bit, rows included (the GPU test replays it from graphs).
TEST(GraphedWindow, on_the_cpu_fp8_delayed_scaling_equals_a_plain_window) {
  test::Schedule s;
  s.windows = 3;
  s.K = 2;
  s.fp8 = test::Fp8Mode::delayed;
  const test::GraphedOutcome out = test::graphed_matches_eager(Device::cpu(), DType::f32, s);
  EXPECT_EQ(out.counts.eager_micro_steps, 6);
  EXPECT_EQ(out.warnings, "");
}

TEST(GraphedWindow, on_the_cpu_fp8_codes_in_the_compute_slots_train_as_codes_apart) {
  test::fp8_codes_in_slots_train_as_codes_apart(Device::cpu());
}

// Note [Concurrent micro-batches]: on the CPU the micro-steps of a group run
// one after another as they arrive in its buffers, bitwise a plain Window;
// K = 3 with groups of 2 leaves a last group of one. FP8 layers with delayed
// scaling take part as well.
TEST(GraphedWindow, on_the_cpu_concurrent_micro_batches_run_in_order_and_equal_a_plain_window) {
  test::Schedule s;
  s.windows = 3;
  s.K = 3;
  s.concurrent = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(Device::cpu(), DType::f32, s);
  EXPECT_EQ(out.counts.eager_micro_steps, 9);
  EXPECT_EQ(out.counts.graphs, 0);
  EXPECT_EQ(out.warnings, "");
  s.fp8 = test::Fp8Mode::delayed;
  const test::GraphedOutcome fp8 = test::graphed_matches_eager(Device::cpu(), DType::f32, s);
  EXPECT_EQ(fp8.counts.eager_micro_steps, 9);
  EXPECT_EQ(fp8.warnings, "");
}

// Note [Weight gradients on a branch]: only captures use the branch, so on the
// CPU the option changes nothing: bitwise a plain Window, no entry issued.
TEST(GraphedWindow, on_the_cpu_the_weight_gradient_branch_stays_unused) {
  test::Schedule s;
  s.windows = 2;
  s.K = 2;
  s.branch_lag = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(Device::cpu(), DType::f32, s);
  EXPECT_EQ(out.counts.eager_micro_steps, 4);
  EXPECT_EQ(out.branch_entries, 0);
}

// The inputs wait for the rest of their group (on the CPU too, where a group
// runs eagerly): flush() runs them, as a checkpoint inside a window needs.
TEST(GraphedWindow, flush_runs_a_group_that_is_not_whole) {
  test::GraphedGPT2 run(Device::cpu(), DType::f32, 4);
  optim::GraphedWindow g(*run.window, run.step());
  g.set_concurrent_micro_batches(3);
  g.backward(run.batch(0, 0, 2));
  g.backward(run.batch(0, 1, 2));
  EXPECT_EQ(run.window->micro_step(), 0);
  EXPECT_EQ(g.pending_micro_steps(), 2);
  g.flush();
  EXPECT_EQ(run.window->micro_step(), 2);
  EXPECT_EQ(g.pending_micro_steps(), 0);
  g.flush();  // nothing waits
  EXPECT_EQ(run.window->micro_step(), 2);
  g.backward(run.batch(0, 2, 2));  // a group of the two left: runs when both came
  EXPECT_EQ(run.window->micro_step(), 2);
  g.backward(run.batch(0, 3, 2));
  EXPECT_TRUE(g.ready());
  g.close();
  EXPECT_EQ(g.counts().eager_micro_steps, 4);
}

TEST(GraphedWindow, bad_use_is_an_error) {
  test::graphed_window_refuses_bad_use(Device::cpu());
}

// Note [Hyperparameters on the device]: the buffer the fused pass reads in
// place of its arguments, and its checks.
TEST(FusedOptimizer, reads_the_stored_hyperparameters_in_place_of_its_arguments) {
  const int64_t n = 64;
  auto run = [&](double lr_in_config, bool with_hyper) {
    Tensor p = test::random_normal({n}, DType::f64), g = test::random_normal({n}, DType::f64);
    p.copy_(full({n}, 0.5, DType::f64));
    g.copy_(full({n}, 0.25, DType::f64));
    Tensor m = zeros({n}, DType::f64), v = zeros({n}, DType::f64);
    Tensor state = kernels::make_window_state(1.0, Device::cpu());
    state.narrow(0, kernels::kCoef, 1).fill_(1.0);
    state.narrow(0, kernels::kStep, 1).fill_(1.0);
    kernels::OptimizerConfig c;
    c.groups = {{lr_in_config, 0.1}};
    kernels::OptimizerBuffers b;
    b.params = p;
    b.grads = g;
    b.exp_avg = m;
    b.exp_avg_sq = v;
    b.chunk_groups = zeros({2}, DType::i32);
    if (with_hyper) {
      b.hyper = zeros({kernels::kHyperSize}, DType::f64);
      kernels::OptimizerConfig stored = c;
      stored.groups = {{1e-2, 0.1}};
      kernels::store_hyperparameters(stored, b.hyper);
      EXPECT_EQ(b.hyper.to_vector<double>()[0], 1e-2);
      EXPECT_EQ(b.hyper.to_vector<double>()[1], 0.1);
    }
    kernels::fused_optimizer_step(c, b, state);
    return p;
  };
  // The stored 1e-2 wins over the argument's 5.0, and equals a pass given 1e-2.
  EXPECT_TRUE(test::all_equal(run(5.0, true), run(1e-2, false)));
  EXPECT_FALSE(test::all_equal(run(5.0, false), run(1e-2, false)));

  kernels::OptimizerConfig c;
  c.groups = {{1e-3, 0.0}};
  EXPECT_ERROR(kernels::store_hyperparameters(c, zeros({3}, DType::f64)), "store_hyperparameters",
               "hyper has shape [3]", "expected [16]");
  EXPECT_ERROR(kernels::store_hyperparameters(c, zeros({16}, DType::f32)), "store_hyperparameters",
               "hyper");
  c.groups = {{-1.0, 0.0}};
  EXPECT_ERROR(kernels::store_hyperparameters(c, zeros({16}, DType::f64)), "store_hyperparameters",
               "-1");
}

TEST(Window, an_unused_parameter_is_stepped_with_a_zero_gradient) {
  const Tensor used = requires_grad_(full({3}, 1.0, DType::f64));
  const Tensor unused = requires_grad_(full({3}, 1.0, DType::f64));
  optim::Optimizer opt(optim::AdamWOptions(0.1).weight_decay(0.5));
  optim::ParamStore arena({{"used", used}, {"unused", unused}},
                          optim::ParamStoreOptions().master_dtype(DType::f64));
  optim::Window window(arena, opt, optim::WindowOptions());
  window.backward({sum(used), full({}, 1.0, DType::i64)});
  window.close();
  // p <- p - lr * wd * p, then Adam's update of a zero gradient, which is 0.
  for (double v : arena.master_view(1).to_vector<double>())
    EXPECT_EQ(v, 1.0 - 0.1 * 0.5);
  EXPECT_EQ(window.report().optimizer_steps, 1);
  // The scaler's cap (the other departure the README lists) defaults to 2^24.
  EXPECT_EQ(optim::LossScalerOptions::dynamic().config().max_scale, 16777216.0);
}

TEST(Window, misuse_is_an_error) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::ParamStore arena(model.named_parameters(), optim::ParamStoreOptions().moments(0));
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(2));
  EXPECT_ERROR(window.close(), "Window::close", "0 of 2");
  Tensor x = test::random_normal({3, 4});
  Tensor y = from_vector<int64_t>({0, 1, 2}, {3});
  window.backward(cross_entropy(model.forward(x), y));
  window.backward(cross_entropy(model.forward(x), y));
  EXPECT_ERROR(window.backward(cross_entropy(model.forward(x), y)), "Window::backward", "close()");
  window.close();
  EXPECT_EQ(window.windows_closed(), 1);
  EXPECT_EQ(window.report().items, 6.0);
  EXPECT_ERROR(optim::Window(arena, opt, optim::WindowOptions().micro_steps(0)), "micro_steps");
  optim::Optimizer adam(optim::AdamOptions(1e-3));
  EXPECT_ERROR(optim::Window(arena, adam, optim::WindowOptions()), "moment arenas");
}

// Note [Mid-window checkpoints], at a window boundary, in the middle and at
// K-1 (tests/optim/checkpoint_cases.h).
TEST(Window, checkpoint_resumes_bit_exactly_at_any_micro_step) {
  test::checkpoint_resumes_bit_exactly_at_any_micro_step(Device::cpu());
}

TEST(Window, load_rejects_a_mismatched_checkpoint) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::AdamWOptions(1e-3));
  optim::ParamStore arena(model.named_parameters(), optim::ParamStoreOptions());
  optim::Window window(arena, opt, optim::WindowOptions());
  std::map<std::string, Tensor> state = window.state_dict();
  state["master"] = zeros({7});
  EXPECT_ERROR(window.load_state_dict(state), "load_state_dict", "master", "[7]");
  state.erase("master");
  EXPECT_ERROR(window.load_state_dict(state), "missing", "master");
}

// A window state whose counters are no counts, or whose scale is not finite
// and positive, is refused before anything changes (report() casts the
// counters to int64: fuzz_window_state found a count of 5.8e252 accepted).
TEST(Window, load_rejects_a_window_state_whose_counters_are_no_counts) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::AdamWOptions(1e-3));
  optim::ParamStore store(model.named_parameters(), optim::ParamStoreOptions());
  optim::Window window(store, opt, optim::WindowOptions());
  const std::map<std::string, Tensor> good = window.state_dict();
  const Tensor master = store.master().clone();
  auto with = [&](int field, double value) {
    std::map<std::string, Tensor> state = good;
    state["window_state"] = good.at("window_state").clone();
    state["window_state"].narrow(0, field, 1).fill_(value);
    return state;
  };
  EXPECT_ERROR(window.load_state_dict(with(kernels::kStep, 5.8e252)), "window_state[5]",
               "not a count");
  EXPECT_ERROR(window.load_state_dict(with(kernels::kSkippedWindows, -1.0)), "window_state[6]");
  EXPECT_ERROR(window.load_state_dict(with(kernels::kNoiseWindows, 2.5)), "window_state[13]");
  EXPECT_ERROR(window.load_state_dict(with(kernels::kScale, std::nan(""))), "loss scale");
  EXPECT_ERROR(window.load_state_dict(with(kernels::kItems, -3.0)), "item count");
  std::map<std::string, Tensor> far = good;
  far["windows_closed"] = from_vector<int64_t>({INT64_MAX - 1}, {});  // item() would round it
  EXPECT_ERROR(window.load_state_dict(far), "windows_closed = 9223372036854775806", "not a count");
  // Refused before anything changed; N may be NaN (a bad index carried).
  EXPECT_TRUE(test::all_equal(store.master(), master));
  window.load_state_dict(with(kernels::kItems, std::nan("")));
}

// Note [Mid-window checkpoints]: a checkpoint inside a window names its
// micro-step; a Window with fewer micro-steps, a Window already inside a
// window, or flags for another arena are refused.
TEST(Window, a_mid_window_checkpoint_is_refused_where_it_cannot_resume) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::ParamStore arena(model.named_parameters(), optim::ParamStoreOptions().moments(0));
  optim::Window window(arena, opt, optim::WindowOptions().micro_steps(4));
  const Tensor x = test::random_normal({3, 4});
  const Tensor y = from_vector<int64_t>({0, 1, 2}, {3});
  for (int i = 0; i < 3; ++i)
    window.backward(cross_entropy(model.forward(x), y));
  std::map<std::string, Tensor> state = window.state_dict();
  EXPECT_EQ(state.at("micro_step").item(), 3.0);
  EXPECT_ERROR(window.load_state_dict(state), "load_state_dict", "micro-step 3",
               "load between windows");
  // Other models of the same shapes: a parameter joins one store only (Note [One owner]).
  Generator gen2(1), gen3(1);
  nn::MLP model2({4, 3}, {Device::cpu(), DType::f32, &gen2});
  nn::MLP model3({4, 3}, {Device::cpu(), DType::f32, &gen3});
  optim::Optimizer opt2(optim::SGDOptions(0.1));
  optim::ParamStore arena2(model2.named_parameters(), optim::ParamStoreOptions().moments(0));
  optim::Window short_window(arena2, opt2, optim::WindowOptions().micro_steps(2));
  const Tensor before = arena2.master().clone();
  EXPECT_ERROR(short_window.load_state_dict(state), "micro-step 3", "has 2 micro-steps");
  EXPECT_TRUE(test::all_equal(arena2.master(), before));  // refused before anything changed
  optim::Optimizer opt3(optim::SGDOptions(0.1));
  optim::ParamStore arena3(model3.named_parameters(), optim::ParamStoreOptions().moments(0));
  optim::Window fresh(arena3, opt3, optim::WindowOptions().micro_steps(4));
  state["grads_written"] = zeros({7}, DType::i64);
  EXPECT_ERROR(fresh.load_state_dict(state), "grads_written", "[7]");
}

}  // namespace
}  // namespace accrue
