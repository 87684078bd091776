// Optimizer options, schedules, the loss scaler's options and the Window's
// contract: validation, misuse errors and checkpoints that resume bit-exactly.
#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>

#include "autograd/ops.h"
#include "core/tensor_io.h"
#include "nn/module.h"
#include "optim/window.h"
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

// One window of k micro-batches drawn from `seed`.
void train_window(optim::Window& window, const nn::MLP& model, int64_t k, uint64_t seed) {
  Generator data(seed);
  for (int64_t i = 0; i < k; ++i) {
    Tensor x = randn({5, 6}, DType::f32, Device::cpu(), &data);
    Tensor y = randint(0, 3, {5}, DType::i64, Device::cpu(), &data);
    window.backward(cross_entropy(model.forward(x), y));
  }
  window.close();
}

TEST(Window, misuse_is_an_error) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::SGDOptions(0.1));
  GradArena arena(model.parameters(), {}, {Device::cpu(), DType::f32, DType::f32, 0});
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

TEST(Window, checkpoint_resumes_bit_exactly) {
  // Run A: 6 windows straight. Run B: 3 windows, save to a safetensors file,
  // load into a fresh model/arena/window, 3 more windows. Same bits at the end.
  auto make = [](Generator& gen, std::unique_ptr<nn::MLP>& model, std::unique_ptr<GradArena>& arena,
                 std::unique_ptr<optim::Optimizer>& opt, std::unique_ptr<optim::Window>& window) {
    model = std::make_unique<nn::MLP>(std::vector<int64_t>{6, 12, 3},
                                      nn::ParamOptions{Device::cpu(), DType::f32, &gen});
    opt = std::make_unique<optim::Optimizer>(optim::AdamWOptions(1e-2).weight_decay(0.1));
    arena = std::make_unique<GradArena>(model->parameters(), std::vector<std::string>{},
                                        ArenaOptions{Device::cpu(), DType::f32, DType::f32, 2});
    window = std::make_unique<optim::Window>(
        *arena, *opt,
        optim::WindowOptions().micro_steps(3).max_grad_norm(0.5).scaler(
            optim::LossScalerOptions::dynamic().growth_interval(2)));
  };
  Generator ga(5), gb(5), gc(99);
  std::unique_ptr<nn::MLP> ma, mb, mc;
  std::unique_ptr<GradArena> aa, ab, ac;
  std::unique_ptr<optim::Optimizer> oa, ob, oc;
  std::unique_ptr<optim::Window> wa, wb, wc;
  make(ga, ma, aa, oa, wa);
  make(gb, mb, ab, ob, wb);
  for (uint64_t w = 0; w < 6; ++w)
    train_window(*wa, *ma, 3, 100 + w);
  for (uint64_t w = 0; w < 3; ++w)
    train_window(*wb, *mb, 3, 100 + w);
  const std::string path =
      (std::filesystem::temp_directory_path() / "accrue_window_checkpoint.safetensors").string();
  save_safetensors(path, wb->state_dict());
  make(gc, mc, ac, oc, wc);  // different initial weights: the load must replace them
  wc->load_state_dict(load_safetensors(path));
  std::filesystem::remove(path);
  EXPECT_EQ(wc->windows_closed(), 3);
  for (uint64_t w = 3; w < 6; ++w)
    train_window(*wc, *mc, 3, 100 + w);
  EXPECT_TRUE(test::all_equal(ac->master(), aa->master()));
  EXPECT_TRUE(test::all_equal(ac->moment(0), aa->moment(0)));
  EXPECT_TRUE(test::all_equal(ac->moment(1), aa->moment(1)));
  EXPECT_TRUE(test::all_equal(wc->state(), wa->state()));
  // The scale grew (growth_interval 2): the scaler state was part of the checkpoint.
  EXPECT_GT(wa->report().loss_scale, 65536.0);
  EXPECT_EQ(wa->report().loss_scale, wc->report().loss_scale);
}

TEST(Window, load_rejects_a_mismatched_checkpoint) {
  Generator gen(1);
  nn::MLP model({4, 3}, {Device::cpu(), DType::f32, &gen});
  optim::Optimizer opt(optim::AdamWOptions(1e-3));
  GradArena arena(model.parameters(), {}, {Device::cpu(), DType::f32, DType::f32, 2});
  optim::Window window(arena, opt, optim::WindowOptions());
  std::map<std::string, Tensor> state = window.state_dict();
  state["master"] = zeros({7});
  EXPECT_ERROR(window.load_state_dict(state), "load_state_dict", "master", "[7]");
  state.erase("master");
  EXPECT_ERROR(window.load_state_dict(state), "missing", "master");
}

}  // namespace
}  // namespace accrue
