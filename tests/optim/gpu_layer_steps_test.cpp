// Note [Close under the forward] on CUDA: the layer ranges on a side stream
// beside the next window's forward, bitwise the sequential close on the same
// GPU; and the test mode (steps on first read) on the GPU's stream.
#include <gtest/gtest.h>

#include "accrue/core/allocator.h"
#include "accrue/core/env_flag.h"

#include "tests/optim/layer_steps_cases.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::CloseModel;

// Under compute-sanitizer (ACCRUE_UNDER_SANITIZER=1) each test runs one case
// of each kind: racecheck took over 150 s for the capped-grid test's first
// cases alone (bench/RESULTS.md), and what the sanitizers look for (the side
// stream's ordering) is the same in every case. The GPU suite runs them all.
bool under_sanitizer() {
  return env_flag("ACCRUE_UNDER_SANITIZER");
}

TEST(GpuCloseUnderForward, side_stream_steps_give_the_sequential_bits) {
  ACCRUE_REQUIRE_CUDA();
  for (int64_t min_elements : {int64_t{1}, int64_t{4096}, int64_t{1} << 20}) {
    SCOPED_TRACE("min_elements " + std::to_string(min_elements));
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(), DType::bf16,
                                                min_elements, /*lazy=*/false);
    if (under_sanitizer()) return;
    test::expect_close_under_forward_is_bitwise(CloseModel::llama, Device::cuda(), DType::bf16,
                                                min_elements, /*lazy=*/false);
  }
  test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(), DType::f32, 4096,
                                              /*lazy=*/false);
  test::expect_close_under_forward_is_bitwise(CloseModel::mlp, Device::cuda(), DType::bf16, 1,
                                              /*lazy=*/false);
  test::expect_close_under_forward_is_bitwise(CloseModel::resnet, Device::cuda(), DType::f32, 1,
                                              /*lazy=*/false);
  for (Fp8Recipe recipe : {Fp8Recipe::tensor, Fp8Recipe::block})
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(), DType::bf16, 4096,
                                                /*lazy=*/false, recipe);
}

// Each range's launch capped at a few blocks (WindowOptions::close_under_forward's
// max_blocks): a grid-stride loop gives the same bits on any grid.
TEST(GpuCloseUnderForward, capped_grids_give_the_sequential_bits) {
  ACCRUE_REQUIRE_CUDA();
  for (int64_t max_blocks : {int64_t{3}, int64_t{1}, int64_t{8}}) {
    SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
    test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(), DType::bf16, 4096,
                                                /*lazy=*/false, std::nullopt, max_blocks);
    if (under_sanitizer()) return;
  }
}

// Micro-steps replayed from graphs that wait on the side stream's events.
// Graphs need the stream-ordered pool (Note [Capturable code]), which the
// compute-sanitizer runs replace with the plain allocator: this test keeps
// the pool, so that the sanitizers see the replays.
TEST(GpuCloseUnderForward, graphed_micro_steps_give_the_sequential_bits) {
  ACCRUE_REQUIRE_CUDA();
  const CudaAllocatorMode before = cuda_allocator_mode();
  set_cuda_allocator_mode(CudaAllocatorMode::StreamOrderedPool);
  for (int64_t min_elements : {int64_t{1}, int64_t{4096}}) {
    SCOPED_TRACE("min_elements " + std::to_string(min_elements));
    test::expect_graphed_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(),
                                                        DType::bf16, min_elements);
    if (under_sanitizer()) break;
    test::expect_graphed_close_under_forward_is_bitwise(CloseModel::llama, Device::cuda(),
                                                        DType::bf16, min_elements);
  }
  set_cuda_allocator_mode(before);
}

// Note [Steps graph]: with the stream-ordered pool every close replays the
// one captured graph of the ranges on the side stream; with the plain
// allocator (no capture) the ranges go there as eager kernels. Either way the
// bits are the sequential close's.
TEST(GpuCloseUnderForward, steps_replay_one_graph_with_the_sequential_bits) {
  ACCRUE_REQUIRE_CUDA();
  struct RestoreMode {
    CudaAllocatorMode before = cuda_allocator_mode();
    ~RestoreMode() { set_cuda_allocator_mode(before); }
  } restore;
  constexpr int64_t kWindows = 3, kK = 2;
  struct Case {
    CudaAllocatorMode mode;
    std::optional<Fp8Recipe> fp8;
    const char* what;
  };
  for (const Case& c : {Case{CudaAllocatorMode::StreamOrderedPool, std::nullopt, "pool"},
                        Case{CudaAllocatorMode::StreamOrderedPool, Fp8Recipe::tensor, "pool, fp8"},
                        Case{CudaAllocatorMode::Plain, std::nullopt, "plain"}}) {
    SCOPED_TRACE(c.what);
    set_cuda_allocator_mode(c.mode);
    const bool graphed = c.mode == CudaAllocatorMode::StreamOrderedPool;
    test::CloseRun a(CloseModel::gpt2, Device::cuda(), DType::bf16, test::sequential_close(kK),
                     c.fp8);
    test::CloseRun b(CloseModel::gpt2, Device::cuda(), DType::bf16,
                     test::close_under_forward(kK, 4096, /*lazy=*/false), c.fp8);
    const std::vector<optim::WindowReport> ra = a.train(kWindows, kK);
    const std::vector<optim::WindowReport> rb = b.train(kWindows, kK);
    // One launch a close, the skipped window's too (its kernels return at once).
    ASSERT_NE(b.window->layer_steps(), nullptr);
    EXPECT_EQ(b.window->layer_steps()->graphed_launches(), graphed ? kWindows : 0);
    EXPECT_EQ(b.window->layer_steps()->graph_captures(), graphed ? 1 : 0);
    EXPECT_EQ(a.window->layer_steps(), nullptr);
    test::expect_same_run(a, ra, b, rb);
    if (under_sanitizer()) break;
  }
}

TEST(GpuCloseUnderForward, steps_on_first_read_give_the_sequential_bits) {
  ACCRUE_REQUIRE_CUDA();
  test::expect_close_under_forward_is_bitwise(CloseModel::gpt2, Device::cuda(), DType::bf16, 1,
                                              /*lazy=*/true);
  test::expect_close_under_forward_is_bitwise(CloseModel::llama, Device::cuda(), DType::f32, 4096,
                                              /*lazy=*/true);
}

}  // namespace
}  // namespace accrue
