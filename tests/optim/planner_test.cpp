// Note [Micro-batch planner] on the CPU, whose allocator counts bytes as
// CUDA's does: the plan follows the budget, out-of-memory steps end the search,
// and a budget nothing fits is an error naming the sizes.
#include <gtest/gtest.h>

#include <cstdio>

#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/nn/module.h"
#include "accrue/optim/planner.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

struct Mlp {
  Mlp() : gen(3), model({128, 512, 512, 10}, {Device::cpu(), DType::f32, &gen}) {}
  // One micro-step's forward and backward at micro-batch b (gradients dropped after).
  void step(int64_t b) {
    const Tensor x = randn({b, 128}, DType::f32, Device::cpu(), &gen);
    const Tensor y = randint(0, 10, {b}, DType::i64, Device::cpu(), &gen);
    accrue::backward(cross_entropy(model.forward(x), y).sum);
    for (const Tensor& p : model.parameters())
      clear_grad(p);
  }
  Generator gen;
  nn::MLP model;
};

optim::PlanOptions options(int64_t budget, double margin = 0.0) {
  optim::PlanOptions o;
  o.global_batch = 512;
  o.world_size = 2;
  o.budget_bytes = budget;
  o.margin = margin;
  return o;
}

TEST(Planner, the_largest_micro_batch_within_the_budget) {
  Mlp m;
  auto step = [&](int64_t b) { m.step(b); };
  const optim::MicroBatchPlan all =
      plan_micro_batch(Device::cpu(), step, options(int64_t{1} << 40));
  std::printf("[planner] %s\n", all.describe().c_str());
  EXPECT_EQ(all.micro_batch, 256);  // the whole per-rank batch
  EXPECT_EQ(all.micro_steps, 1);
  ASSERT_EQ(all.measured.size(), 9u);  // 1, 2, 4, ..., 256
  EXPECT_GT(all.measured.back().second, all.measured.front().second);
  // A budget between the peaks of 16 and 32 items plans 16 x K 16.
  const int64_t budget = (all.measured[4].second + all.measured[5].second) / 2;
  const optim::MicroBatchPlan fit = plan_micro_batch(Device::cpu(), step, options(budget));
  std::printf("[planner] %s\n", fit.describe().c_str());
  EXPECT_EQ(fit.micro_batch, 16);
  EXPECT_EQ(fit.micro_steps, 16);
  EXPECT_LE(fit.predicted_bytes, budget);
  // The margin keeps part of the budget free: a budget of exactly the peak of
  // 256 items fits 256 without a margin and less with 20% held back.
  const int64_t peak256 = all.measured.back().second;
  EXPECT_EQ(plan_micro_batch(Device::cpu(), step, options(peak256)).micro_batch, 256);
  EXPECT_LT(plan_micro_batch(Device::cpu(), step, options(peak256, 0.2)).micro_batch, 256);
}

TEST(Planner, an_out_of_memory_step_ends_the_search) {
  Mlp m;
  const optim::MicroBatchPlan plan = plan_micro_batch(
      Device::cpu(),
      [&](int64_t b) {
        if (b >= 64) ACCRUE_FAIL("out of memory on cuda:0: asked for 1 GiB (emulated)");
        m.step(b);
      },
      options(int64_t{1} << 40));
  EXPECT_EQ(plan.micro_batch, 32);
  EXPECT_EQ(plan.micro_steps, 8);
  EXPECT_EQ(plan.measured.back(), (std::pair<int64_t, int64_t>{64, -1}));
  EXPECT_NE(plan.describe().find("64: out of memory"), std::string::npos);
}

TEST(Planner, bad_budgets_and_batches_are_errors) {
  Mlp m;
  auto step = [&](int64_t b) { m.step(b); };
  EXPECT_ERROR(plan_micro_batch(Device::cpu(), step, options(1024)), "plan_micro_batch",
               "even a micro-batch of 1 needs", "budget");
  EXPECT_ERROR(plan_micro_batch(Device::cpu(), step, options(0)), "plan_micro_batch",
               "budget_bytes", "cpu");
  optim::PlanOptions o = options(1 << 30);
  o.world_size = 3;
  EXPECT_ERROR(plan_micro_batch(Device::cpu(), step, o), "plan_micro_batch", "512", "3 ranks");
  // Errors other than running out of memory are not swallowed.
  EXPECT_ERROR(
      plan_micro_batch(
          Device::cpu(), [](int64_t) { ACCRUE_FAIL("model: bad shape"); }, options(1 << 30)),
      "model: bad shape");
}

}  // namespace
}  // namespace accrue
