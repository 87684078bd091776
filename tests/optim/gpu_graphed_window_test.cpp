// Note [Graphed window] on CUDA: micro-steps and closes replayed from graphs
// give bitwise the eager run's weights, and what cannot be captured runs
// eagerly with its warning.
#include "accrue/core/allocator.h"
#include "accrue/core/cuda_graph.h"
#include "tests/optim/graphed_window_cases.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

// Graphs need the stream-ordered pool (Note [Capturable code]); the
// compute-sanitizer runs set the plain allocator for every other test.
struct PoolScope {
  CudaAllocatorMode before = cuda_allocator_mode();
  PoolScope() { set_cuda_allocator_mode(CudaAllocatorMode::StreamOrderedPool); }
  ~PoolScope() { set_cuda_allocator_mode(before); }
};

// 4 windows of K = 3: window 0 runs micro-steps 0 and 1 and its close
// eagerly (the warm-ups) and captures micro-step 2 ("rest"); window 1
// captures micro-step 0 ("first") and the close; everything after replays.
void expect_captured_counts(const optim::GraphedWindow::Counts& c) {
  EXPECT_EQ(c.graphs, 3);
  EXPECT_EQ(c.eager_micro_steps, 2);
  EXPECT_EQ(c.replayed_micro_steps, 10);
  EXPECT_EQ(c.eager_closes, 1);
  EXPECT_EQ(c.replayed_closes, 3);
}

TEST(GpuGraphedWindow, bf16_replays_are_bitwise_the_eager_run) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, {});
  expect_captured_counts(out.counts);
  EXPECT_EQ(out.warnings, "");
  EXPECT_GT(graph_memory(0).reserved_bytes, 0);
}

TEST(GpuGraphedWindow, f32_replays_are_bitwise_the_eager_run) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::f32, {});
  expect_captured_counts(out.counts);
  EXPECT_EQ(out.warnings, "");
}

// Note [Concurrent micro-batches]: K = 4 in groups of 2 (window 0 warms up
// "first:2" and "rest:2" eagerly, window 1 captures both) and in groups of 3
// (a group of 3, then one of 1): bitwise the eager loop, with the slots'
// writes ordered by events across the streams.
TEST(GpuGraphedWindow, concurrent_micro_batches_are_bitwise_the_eager_loop) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  for (int n : {2, 3}) {
    SCOPED_TRACE("concurrent micro-batches " + std::to_string(n));
    test::Schedule s;
    s.K = 4;
    s.concurrent = n;
    const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
    EXPECT_EQ(out.counts.graphs, 3);  // two groups and the close
    EXPECT_EQ(out.counts.eager_micro_steps, 4);
    EXPECT_EQ(out.counts.replayed_micro_steps, 12);
    EXPECT_EQ(out.counts.eager_closes, 1);
    EXPECT_EQ(out.warnings, "");
  }
}

// Note [Weight gradients on a branch]: the captured micro-steps issue their
// Linear, LayerNorm and classifier parameter gradients on a side stream
// (GPT-2's decoder blocks and its tied classifier, whose slot the embedding's
// backward then adds to from the current stream), at lags 1 and 3, in bf16
// and f32, and with FP8 Linears: bitwise the eager run.
TEST(GpuGraphedWindow, weight_gradients_on_a_branch_are_bitwise_the_eager_run) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  for (DType compute : {DType::bf16, DType::f32})
    for (int lag : {1, 3}) {
      SCOPED_TRACE(std::string(dtype_name(compute)) + ", lag " + std::to_string(lag));
      test::Schedule s;
      s.branch_lag = lag;
      const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, compute, s);
      expect_captured_counts(out.counts);
      EXPECT_EQ(out.warnings, "");
      // Two captures (first, rest), each with 2 blocks x (4 Linears and 2
      // LayerNorms), the final LayerNorm and the classifier.
      EXPECT_EQ(out.branch_entries, 28);
    }
  // FP8 Linears (Note [FP8 delayed scaling]: the first window calibrates, eagerly):
  // their dW from the cast's codes on the branch too.
  test::Schedule s;
  s.windows = 5;
  s.fp8 = test::Fp8Mode::delayed;
  s.branch_lag = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
  EXPECT_GT(out.counts.replayed_micro_steps, 0);
  EXPECT_GT(out.branch_entries, 0);
}

// Note [FP8 delayed scaling]: the first window calibrates (every call eager),
// then the micro-steps' graphs cast with the rows' scales, which each replayed
// close updates on the device: bitwise the eager run, rows included. Current
// scaling with the kept copies as well. One micro-step at a time, and in
// groups of 2 (Note [Concurrent micro-batches]: a group of 2 and one of 1 at
// K = 3), where delayed scaling's casts merge their amax into the rows from
// both streams (an atomic max).
TEST(GpuGraphedWindow, fp8_replays_are_bitwise_the_eager_run) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  for (test::Fp8Mode mode : {test::Fp8Mode::current, test::Fp8Mode::delayed})
    for (int n : {1, 2}) {
      SCOPED_TRACE(std::string(mode == test::Fp8Mode::delayed ? "delayed" : "current") +
                   " scaling, micro-steps in flight: " + std::to_string(n));
      test::Schedule s;
      s.windows = 5;
      s.concurrent = n;
      s.fp8 = mode;
      const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
      EXPECT_GT(out.counts.replayed_micro_steps, 0);
      EXPECT_GT(out.counts.replayed_closes, 0);
      if (mode == test::Fp8Mode::delayed) {
        EXPECT_GE(out.counts.eager_micro_steps, 3);  // window 0 calibrates
      }
    }
}

TEST(GpuGraphedWindow, fp8_codes_in_the_compute_slots_train_as_codes_apart) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  test::fp8_codes_in_slots_train_as_codes_apart(kGpu);
}

TEST(GpuGraphedWindow, one_micro_step_per_window_uses_the_first_graph_only) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  test::Schedule s;
  s.K = 1;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
  EXPECT_EQ(out.counts.graphs, 2);
  EXPECT_EQ(out.counts.eager_micro_steps, 1);
  EXPECT_EQ(out.counts.replayed_micro_steps, 3);
  EXPECT_EQ(out.counts.replayed_closes, 3);
}

TEST(GpuGraphedWindow, other_shapes_run_eagerly_with_one_warning) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  test::Schedule s;
  s.odd_w = 2;
  s.odd_k = 1;
  s.odd_b = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
  EXPECT_EQ(out.counts.eager_micro_steps, 3);
  EXPECT_EQ(out.counts.replayed_micro_steps, 9);
  EXPECT_NE(out.warnings.find("a micro-step on inputs [2, 32] i64"), std::string::npos)
      << out.warnings;
  EXPECT_NE(out.warnings.find("runs eagerly"), std::string::npos) << out.warnings;
}

TEST(GpuGraphedWindow, dropout_refuses_the_capture_and_runs_eagerly) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, {}, 0.1);
  EXPECT_EQ(out.counts.replayed_micro_steps, 0);
  EXPECT_EQ(out.counts.eager_micro_steps, 12);
  EXPECT_EQ(out.counts.graphs, 1);  // the close has no dropout
  EXPECT_NE(out.warnings.find("dropout"), std::string::npos) << out.warnings;
}

TEST(GpuGraphedWindow, the_plain_allocator_keeps_everything_eager) {
  ACCRUE_REQUIRE_CUDA();
  const CudaAllocatorMode before = cuda_allocator_mode();
  set_cuda_allocator_mode(CudaAllocatorMode::Plain);
  test::Schedule s;
  s.windows = 2;
  const test::GraphedOutcome out = test::graphed_matches_eager(kGpu, DType::bf16, s);
  set_cuda_allocator_mode(before);
  EXPECT_EQ(out.counts.graphs, 0);
  EXPECT_EQ(out.counts.eager_micro_steps, 6);
  EXPECT_NE(out.warnings.find("plain mode"), std::string::npos) << out.warnings;
}

TEST(GpuGraphedWindow, bad_use_is_an_error) {
  ACCRUE_REQUIRE_CUDA();
  const PoolScope pool;
  test::graphed_window_refuses_bad_use(kGpu);
}

}  // namespace
}  // namespace accrue
