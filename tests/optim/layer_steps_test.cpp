// Note [Step ranges] and Note [Close under the forward] on the CPU.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue/autograd/parameter_gate.h"
#include "accrue/autograd/variable.h"
#include "accrue/kernels/window_close.h"
#include "accrue/optim/layer_monitor.h"
#include "tests/optim/layer_steps_cases.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::CloseModel;
using test::CloseRun;

// Two stores of the same parameters and gradients: one stepped whole, one
// range by range, last range first; then masters, moments and compute copies.
struct TwoStores {
  std::vector<Tensor> pa, pb;
  std::unique_ptr<optim::ParamStore> a, b;
  Tensor state;

  TwoStores(const optim::Optimizer& opt_a, const optim::Optimizer& opt_b, DType compute) {
    Generator gen(3);
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{7, 5}, {33}, {4, 4, 3}, {1}, {65, 2}}) {
      const Tensor v = randn(shape, DType::f64, Device::cpu(), &gen);
      pa.push_back(requires_grad_(v.clone()));
      pb.push_back(requires_grad_(v.clone()));
    }
    auto options = [&](int moments) {
      return optim::ParamStoreOptions()
          .master_dtype(DType::f64)
          .compute_dtype(compute)
          .moments(moments);
    };
    a = std::make_unique<optim::ParamStore>(pa, options(opt_a.moments_needed()));
    b = std::make_unique<optim::ParamStore>(pb, options(opt_b.moments_needed()));
    const Tensor g = randn({a->padded_numel()}, DType::f64, Device::cpu(), &gen);
    a->grads().copy_(g);
    b->grads().copy_(g);
    state = kernels::make_window_state(1.0, Device::cpu());
    state.narrow(0, kernels::kCoef, 1).fill_(0.7);
    state.narrow(0, kernels::kStep, 1).fill_(3.0);
  }
  void expect_equal(int moments) const {
    EXPECT_TRUE(test::all_equal(b->master(), a->master()));
    for (int m = 0; m < moments; ++m)
      EXPECT_TRUE(test::all_equal(b->moment(m), a->moment(m)));
    if (a->compute().defined()) {
      EXPECT_TRUE(test::all_equal(b->compute(), a->compute()));
    }
  }
};

std::vector<ArenaRange> slot_ranges(const optim::ParamStore& store) {
  std::vector<ArenaRange> ranges;
  for (size_t i = 0; i < store.size(); ++i) {
    const int64_t begin = store.slots()[i].offset;
    const int64_t end = i + 1 < store.size() ? store.slots()[i + 1].offset : store.padded_numel();
    ranges.push_back({begin, end - begin});
  }
  return ranges;
}

void expect_ranges_step_as_one(const std::function<optim::Optimizer()>& make, DType compute,
                               bool found_inf) {
  optim::Optimizer opt_a = make(), opt_b = make();
  TwoStores s(opt_a, opt_b, compute);
  opt_a.add_param_group({s.pa[1], s.pa[3]}, optim::GroupOptions().lr(0.02).weight_decay(0.0));
  opt_b.add_param_group({s.pb[1], s.pb[3]}, optim::GroupOptions().lr(0.02).weight_decay(0.0));
  opt_a.bind(*s.a);
  opt_b.bind(*s.b);
  if (found_inf) s.state.narrow(0, kernels::kFoundInf, 1).fill_(1.0);
  const Tensor before = s.b->master().clone();
  opt_a.step(*s.a, s.state, 4);
  opt_b.store_hyperparameters(4);
  std::vector<ArenaRange> ranges = slot_ranges(*s.b);
  for (auto it = ranges.rbegin(); it != ranges.rend(); ++it)
    opt_b.step_range(*s.b, s.state, 4, *it);
  s.expect_equal(opt_a.moments_needed());
  if (found_inf) {
    EXPECT_TRUE(test::all_equal(s.b->master(), before));  // Note [Skipped window]
  } else {
    EXPECT_FALSE(test::all_equal(s.b->master(), before));
  }
}

TEST(StepRange, ranges_in_any_order_write_the_bits_of_one_step) {
  for (bool found_inf : {false, true}) {
    SCOPED_TRACE(found_inf ? "found_inf" : "finite");
    expect_ranges_step_as_one(
        [] {
          return optim::Optimizer(optim::AdamWOptions(0.01).betas(0.8, 0.9).weight_decay(0.1));
        },
        DType::bf16, found_inf);
    expect_ranges_step_as_one(
        [] { return optim::Optimizer(optim::AdamOptions(0.01).amsgrad(true).weight_decay(0.01)); },
        DType::f64, found_inf);
    expect_ranges_step_as_one(
        [] { return optim::Optimizer(optim::SGDOptions(0.1).momentum(0.9).nesterov(true)); },
        DType::f16, found_inf);
  }
}

TEST(StepRange, bad_ranges_are_errors_naming_them) {
  optim::Optimizer opt_a(optim::AdamWOptions(0.01)), opt_b(optim::AdamWOptions(0.01));
  TwoStores s(opt_a, opt_b, DType::f64);
  opt_b.bind(*s.b);
  const int64_t n = s.b->padded_numel();
  const std::string outside = "Optimizer::step_range: range [0, " + std::to_string(n + 32) +
                              ") is outside the arena's " + std::to_string(n) + " elements";
  EXPECT_ERROR(opt_b.step_range(*s.b, s.state, 0, {0, n + 32}), outside.c_str());
  EXPECT_ERROR(opt_b.step_range(*s.b, s.state, 0, {16, 32}),
               "Optimizer::step_range: range [16, 48) does not start and end on 32-element "
               "chunks");
  EXPECT_ERROR(opt_a.step_range(*s.a, s.state, 0, {0, 32}),
               "Optimizer::step_range: bind(arena) first");
}

TEST(CloseUnderForward, steps_at_the_close_on_the_cpu_bitwise_the_sequential_close) {
  test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::f32, 1,
                                              /*lazy=*/false);
}

// The test mode steps a range only when a read awaits it: the latest a side
// stream could. Every range a slot, and ranges of several slots.
TEST(CloseUnderForward, ranges_stepped_on_first_read_give_the_sequential_bits) {
  for (int64_t min_elements : {int64_t{1}, int64_t{5000}}) {
    SCOPED_TRACE("min_elements " + std::to_string(min_elements));
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::f32,
                                                min_elements, /*lazy=*/true);
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::bf16,
                                                min_elements, /*lazy=*/true);
    test::expect_close_under_forward_is_bitwise(CloseModel::llama, Device::cpu(), DType::f32,
                                                min_elements, /*lazy=*/true);
    test::expect_close_under_forward_is_bitwise(CloseModel::mlp, Device::cpu(), DType::f32,
                                                min_elements, /*lazy=*/true);
    test::expect_close_under_forward_is_bitwise(CloseModel::resnet, Device::cpu(), DType::f32,
                                                min_elements, /*lazy=*/true);
  }
}

// Note [Window FP8 weights]: each range's copies recast after its step.
TEST(CloseUnderForward, fp8_copies_recast_range_by_range_give_the_sequential_bits) {
  for (Fp8Recipe recipe : {Fp8Recipe::tensor, Fp8Recipe::block}) {
    SCOPED_TRACE(recipe == Fp8Recipe::tensor ? "tensor" : "block");
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::bf16, 1,
                                                /*lazy=*/true, recipe);
  }
}

TEST(CloseUnderForward, a_grid_cap_changes_nothing_on_the_cpu) {
  test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::f32, 5000,
                                              /*lazy=*/true, std::nullopt, /*max_blocks=*/2);
}

TEST(CloseUnderForward, a_graphed_window_runs_it_eagerly_on_the_cpu) {
  test::expect_graphed_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cpu(), DType::f32,
                                                      5000);
}

TEST(CloseUnderForward, layer_ranges_cover_the_arena_in_slot_order) {
  CloseRun run(CloseModel::gpt2, Device::cpu(), DType::f32, test::sequential_close(1));
  optim::LayerSteps steps(*run.store, *run.optimizer, 5000, false);
  const std::vector<ArenaRange>& r = steps.ranges();
  ASSERT_GE(r.size(), 3u);
  EXPECT_EQ(r.front().offset, 0);
  for (size_t i = 0; i + 1 < r.size(); ++i) {
    EXPECT_EQ(r[i].offset + r[i].numel, r[i + 1].offset);
    EXPECT_GE(r[i].numel, 5000);
  }
  EXPECT_EQ(r.back().offset + r.back().numel, run.store->padded_numel());
  for (size_t slot = 0; slot < run.store->size(); ++slot) {
    const ArenaRange& mine = r[static_cast<size_t>(steps.range_of_slot()[slot])];
    EXPECT_GE(run.store->slots()[slot].offset, mine.offset);
    EXPECT_LE(run.store->slots()[slot].offset + run.store->slots()[slot].numel,
              mine.offset + mine.numel);
  }
}

// A model that awaits only its first layer: in the test mode the second
// layer's forward reads the old weights, so the bits differ from the
// sequential close's (what the bitwise cases above would catch).
TEST(CloseUnderForward, a_missed_await_changes_the_bits_in_the_test_mode) {
  auto run_two_layers = [](const optim::WindowOptions& options) {
    Generator gen(5);
    nn::Linear first(8, 8, true, {Device::cpu(), DType::f32, &gen});
    nn::Linear second(8, 3, true, {Device::cpu(), DType::f32, &gen});
    std::vector<nn::NamedParameter> params = first.named_parameters();
    for (const nn::NamedParameter& p : second.named_parameters())
      params.push_back({"second." + p.name, p.tensor});
    optim::Optimizer opt(optim::SGDOptions(0.5));
    optim::ParamStore store(params, optim::ParamStoreOptions().moments(opt.moments_needed()));
    optim::Window window(store, opt, options);
    for (int64_t w = 0; w < 3; ++w) {
      Generator data(40 + static_cast<uint64_t>(w));
      nn::await_parameters(first);  // never the second
      const Tensor h = first.forward(randn({4, 8}, DType::f32, Device::cpu(), &data));
      window.backward(cross_entropy(second.forward(h), from_vector<int64_t>({0, 1, 2, 1}, {4})));
      window.close();
    }
    return store.master().clone();
  };
  const Tensor sequential = run_two_layers(optim::WindowOptions());
  const Tensor lazy = run_two_layers(test::close_under_forward(1, 1, /*lazy=*/true));
  EXPECT_FALSE(test::all_equal(lazy, sequential));
}

// Note [Parameter gates]: an installed gate hears awaits only while it says
// it has steps pending; a gate not installed cannot be marked pending.
TEST(ParameterGates, awaits_reach_a_gate_only_while_it_is_pending) {
  struct Counting final : ParameterGate {
    int awaits = 0;
    void await(const Tensor&) override { ++awaits; }
  } gate;
  const Tensor p = full({2}, 1.0, DType::f32);
  EXPECT_ERROR(set_parameter_gate_pending(&gate, true), "set_parameter_gate_pending",
               "not installed");
  install_parameter_gate(&gate);
  await_parameters({p, p});
  EXPECT_EQ(gate.awaits, 0);
  EXPECT_FALSE(parameter_gates_pending());
  set_parameter_gate_pending(&gate, true);
  EXPECT_TRUE(parameter_gates_pending());
  await_parameters({p, p});
  EXPECT_EQ(gate.awaits, 2);
  set_parameter_gate_pending(&gate, false);
  await_parameters(std::vector<Tensor>{p});
  EXPECT_EQ(gate.awaits, 2);
  set_parameter_gate_pending(&gate, true);
  remove_parameter_gate(&gate);  // removing it clears the mark
  EXPECT_FALSE(parameter_gates_pending());
  await_parameters({p});
  EXPECT_EQ(gate.awaits, 2);
}

// A window's gate is pending from its close to micro-step 0's join.
TEST(CloseUnderForward, the_gate_is_pending_from_the_close_to_the_join) {
  CloseRun r(CloseModel::gpt2, Device::cpu(), DType::f32,
             test::close_under_forward(2, 1, /*lazy=*/true));
  EXPECT_FALSE(parameter_gates_pending());
  r.window->backward(r.loss(0, 0));
  r.window->backward(r.loss(0, 1));
  r.window->close();
  EXPECT_TRUE(parameter_gates_pending());
  r.window->backward(r.loss(1, 0));  // its forward awaited; the backward joined
  EXPECT_FALSE(parameter_gates_pending());
}

TEST(CloseUnderForward, a_forward_that_awaits_nothing_is_refused) {
  Generator gen(5);
  nn::Linear layer(8, 3, true, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::SGDOptions(0.5));
  optim::ParamStore store(layer.named_parameters(), optim::ParamStoreOptions());
  optim::Window window(store, opt, test::close_under_forward(1, 1, /*lazy=*/true));
  const Tensor x = randn({4, 8}, DType::f32, Device::cpu(), &gen);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 1}, {4});
  window.backward(cross_entropy(layer.forward(x), y));  // nothing pending yet
  window.close();
  EXPECT_ERROR(window.backward(cross_entropy(layer.forward(x), y)),
               "Window::backward: close_under_forward, but the forward awaited none of the "
               "store's parameters");
}

TEST(CloseUnderForward, store_reads_and_checkpoints_join_the_pending_steps) {
  CloseRun a(CloseModel::gpt2, Device::cpu(), DType::f32, test::sequential_close(2));
  CloseRun b(CloseModel::gpt2, Device::cpu(), DType::f32, test::close_under_forward(2, 1, true));
  a.train(3, 2);
  b.train(3, 2);
  // b's last close left every range pending (the test mode steps on reads).
  const Tensor wte = b.store->params()[0];
  EXPECT_TRUE(test::all_equal(b.store->value(wte), a.store->value(a.store->params()[0])));
  EXPECT_TRUE(test::all_equal(b.store->master(), a.store->master()));
}

// LayerMonitor either way: in-pass sums step the measured window whole in
// the close; separate passes join before reading the update.
TEST(CloseUnderForward, the_layer_monitor_reads_what_the_sequential_close_gives) {
  for (bool in_pass : {true, false}) {
    SCOPED_TRACE(in_pass ? "in-pass sums" : "separate passes");
    auto measure = [&](const optim::WindowOptions& options) {
      CloseRun run(CloseModel::gpt2, Device::cpu(), DType::f32, options);
      run.train(2, 2);
      auto monitor = in_pass ? std::make_unique<optim::LayerMonitor>(*run.store, *run.optimizer)
                             : std::make_unique<optim::LayerMonitor>(*run.store);
      for (int64_t k = 0; k < 2; ++k)
        run.window->backward(run.loss(2, k));
      monitor->before_close();
      run.window->close();
      monitor->after_close();
      std::vector<optim::LayerReport> layers = monitor->read(run.window->report());
      run.train(1, 2);  // the next window still steps and reads right
      return std::make_pair(layers, run.store->master().clone());
    };
    const auto [sequential, weights] = measure(test::sequential_close(2));
    const auto [lazy, lazy_weights] = measure(test::close_under_forward(2, 1, /*lazy=*/true));
    ASSERT_EQ(lazy.size(), sequential.size());
    for (size_t i = 0; i < lazy.size(); ++i) {
      EXPECT_EQ(lazy[i].grad_norm, sequential[i].grad_norm) << lazy[i].name;
      EXPECT_EQ(lazy[i].update_ratio, sequential[i].update_ratio) << lazy[i].name;
      EXPECT_GT(sequential[i].update_ratio, 0.0) << sequential[i].name;
    }
    EXPECT_TRUE(test::all_equal(lazy_weights, weights));
  }
}

TEST(CloseUnderForward, bad_options_are_errors_naming_them) {
  Generator gen(5);
  nn::Linear layer(8, 3, true, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::SGDOptions(0.5));
  optim::ParamStore store(layer.named_parameters(), optim::ParamStoreOptions());
  EXPECT_ERROR(optim::Window(store, opt, optim::WindowOptions().close_steps_on_first_read(true)),
               "Window: close_steps_on_first_read is close_under_forward's test mode");
  EXPECT_ERROR(optim::Window(store, opt, optim::WindowOptions().close_under_forward(true, 0)),
               "close_under_forward: min_elements must be >= 1, got 0");
  EXPECT_ERROR(optim::Window(store, opt, optim::WindowOptions().close_under_forward(true, 1, -2)),
               "close_under_forward: max_blocks must be >= 0, got -2");
  optim::Window first(store, opt, test::close_under_forward(1, 1, false));
  EXPECT_ERROR(first.begin_whole_capture(),
               "Window::begin_whole_capture: close_under_forward steps the parameters on a side "
               "stream");
  EXPECT_ERROR(optim::Window(store, opt, test::close_under_forward(1, 1, false)),
               "ParamStore: a second Window with close_under_forward on this store");
}

}  // namespace
}  // namespace accrue
