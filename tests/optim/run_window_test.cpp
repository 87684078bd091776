// Note [Out-of-memory retry]: a window that runs out of memory mid-way
// starts again at half the micro-batch and makes the update of the batch.
// Out-of-memory errors are emulated (thrown by the forward above a size, the
// way the allocator throws them), so the test runs on the CPU in f64.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/nn/module.h"
#include "accrue/optim/run_window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr int64_t kItems = 16;

// A model, its arena and a window, the same initial weights every time.
struct Trial {
  Generator gen{7};
  nn::MLP model{{6, 10, 3}, {Device::cpu(), DType::f64, &gen}};
  optim::Optimizer opt{optim::AdamWOptions(1e-2).weight_decay(0.1)};
  optim::ParamStore arena{model.named_parameters(),
                          optim::ParamStoreOptions().master_dtype(DType::f64)};
  optim::Window window;
  Generator data{11};  // the same items in every Trial
  Tensor x = randn({kItems, 6}, DType::f64, Device::cpu(), &data);
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 2, 1, 1, 0, 2}, {kItems});
  std::vector<std::pair<int64_t, int64_t>> calls;  // (first, count) of every forward

  explicit Trial(optim::WindowOptions options = optim::WindowOptions().max_grad_norm(1.0))
      : window(arena, opt, options) {}

  // The forward of items [first, first + count); "out of memory" when a
  // micro-batch of more than `fits` items starts at item `fails_from` or later.
  Loss forward(int64_t first, int64_t count, int64_t fits, int64_t fails_from) {
    calls.push_back({first, count});
    if (count > fits && first >= fails_from)
      throw OutOfMemoryError("out of memory on cpu: asked for 1048576 bytes (emulated)", 1 << 20);
    return cross_entropy(model.forward(x.narrow(0, first, count)), y.narrow(0, first, count));
  }
};

TEST(RunWindow, out_of_memory_mid_window_retries_at_half_and_equals_the_batch) {
  // 8 x K 2 fails in micro-step 1, 4 x K 4 in micro-step 2: both had
  // accumulated micro-steps already, which the restart must drop.
  Trial retried;
  const optim::WindowRun r = optim::run_window(
      retried.window, kItems, 8, [&](int64_t f, int64_t c) { return retried.forward(f, c, 2, 8); },
      {/*max_halvings=*/2});
  EXPECT_EQ(r.micro_batch, 2);
  EXPECT_EQ(r.micro_steps, 8);
  EXPECT_EQ(r.halvings, 2);
  const std::vector<std::pair<int64_t, int64_t>> first_calls(retried.calls.begin(),
                                                             retried.calls.begin() + 5);
  EXPECT_EQ(first_calls,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 8}, {8, 8}, {0, 4}, {4, 4}, {8, 4}}));
  EXPECT_EQ(retried.window.report().items, static_cast<double>(kItems));

  // Bitwise the window a clean run at micro-batch 2 makes...
  Trial clean;
  optim::run_window(clean.window, kItems, 2,
                    [&](int64_t f, int64_t c) { return clean.forward(f, c, kItems, 0); });
  EXPECT_TRUE(test::all_equal(retried.arena.master(), clean.arena.master()));
  EXPECT_TRUE(test::all_equal(retried.window.state(), clean.window.state()));
  // ... and the large batch's update up to the order of the additions.
  Trial batch;
  optim::run_window(batch.window, kItems, kItems,
                    [&](int64_t f, int64_t c) { return batch.forward(f, c, kItems, 0); });
  const double diff = test::relative_error(retried.arena.master(), batch.arena.master());
  std::printf("[run_window] retried (2 x K 8) vs one batch of 16: parameters %.2e\n", diff);
  EXPECT_LT(diff, 1e-12);
  EXPECT_NEAR(retried.window.report().loss, batch.window.report().loss,
              1e-14 * batch.window.report().loss);
}

TEST(RunWindow, without_retry_the_error_names_the_sizes_and_a_plan) {
  Trial run;
  try {
    optim::run_window(run.window, kItems, 8,
                      [&](int64_t f, int64_t c) { return run.forward(f, c, 4, 8); });
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string m = e.what();
    std::printf("[run_window] %s\n", m.c_str());
    for (const char* part : {"run_window: out of memory in micro-step 1 of 2 at micro-batch 8",
                             "16 items per window", "asked for 1.0 MiB", "would fit",
                             "max_halvings", "out of memory on cpu: asked for 1048576 bytes"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  // Nothing of the failed window is left: the next one runs as if first.
  EXPECT_EQ(run.window.micro_step(), 0);
  EXPECT_EQ(run.window.windows_closed(), 0);
  Trial clean;
  optim::run_window(run.window, kItems, 4,
                    [&](int64_t f, int64_t c) { return run.forward(f, c, 4, 0); });
  optim::run_window(clean.window, kItems, 4,
                    [&](int64_t f, int64_t c) { return clean.forward(f, c, 4, 0); });
  EXPECT_TRUE(test::all_equal(run.arena.master(), clean.arena.master()));
}

TEST(RunWindow, bad_arguments_are_errors) {
  Trial run;
  auto forward = [&](int64_t f, int64_t c) { return run.forward(f, c, kItems, 0); };
  EXPECT_ERROR(optim::run_window(run.window, kItems, 5, forward), "run_window", "16 items",
               "micro-batches of 5");
  EXPECT_ERROR(optim::run_window(run.window, kItems, 4, forward, {-1}), "max_halvings", "-1");
  Trial means(optim::WindowOptions().micro_steps(2).normalization(
      kernels::Normalization::MeanOfMicroBatchMeans));
  EXPECT_ERROR(optim::run_window(means.window, kItems, 4,
                                 [&](int64_t f, int64_t c) { return means.forward(f, c, 16, 0); }),
               "set_micro_steps", "mean-of-micro-batch-means", "2 -> 4");
  // Other errors pass through untouched.
  EXPECT_ERROR(optim::run_window(run.window, kItems, 4,
                                 [&](int64_t, int64_t) -> Loss { ACCRUE_FAIL("not memory"); }),
               "not memory");
}

}  // namespace
}  // namespace accrue
