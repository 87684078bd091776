// Note [Deferred index checks] on CUDA: the CPU's cases
// (tests/optim/index_check_cases.h), and a window captured as a CUDA graph,
// which fails on any host synchronization.
#include <cuda_runtime.h>

#include <cstdlib>

#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "tests/optim/index_check_cases.h"

namespace accrue {
namespace {

const Device kGpu = Device::cuda(0);

TEST(GpuDeferredIndexChecks, bad_embedding_index_skips_the_window) {
  ACCRUE_REQUIRE_CUDA();
  test::bad_embedding_index_skips_the_window(kGpu);
}

TEST(GpuDeferredIndexChecks, first_fault_in_call_order_is_reported) {
  ACCRUE_REQUIRE_CUDA();
  test::first_fault_in_call_order_is_reported(kGpu);
}

TEST(GpuDeferredIndexChecks, outside_a_window_the_check_is_eager) {
  ACCRUE_REQUIRE_CUDA();
  test::outside_a_window_the_check_is_eager(kGpu);
}

// Stream capture records work instead of running it, and any call that waits
// for the stream (a synchronize, a copy to pageable host memory) ends the
// capture with an error. So a window whose micro-steps and close capture
// cleanly did not synchronize from its first backward to the end of close.
// Then the graph runs, with a bad index in it: the skip and the error come
// from the replay, as they do eagerly.
//
// The test uses the stream-ordered pool even in a compute-sanitizer run
// (ACCRUE_TEST_ALLOCATOR=plain): inside a capture, cudaMallocAsync and
// cudaFreeAsync become the graph's own memory nodes, while plain cudaMalloc
// and cudaFree are not recorded at all, so the replay would write the
// activations freed when the capture ended.
TEST(GpuDeferredIndexChecks, a_window_captures_as_a_graph_so_it_never_synchronizes) {
  ACCRUE_REQUIRE_CUDA();
  struct PoolScope {
    CudaAllocatorMode before = cuda_allocator_mode();
    PoolScope() { set_cuda_allocator_mode(CudaAllocatorMode::StreamOrderedPool); }
    ~PoolScope() { set_cuda_allocator_mode(before); }
  } pool;
  test::TinyTokenModel m(kGpu);
  const Tensor good = m.tokens({0, 1, 2, 3, 4, 5}), bad = m.tokens({0, 1, 2, 3, 4, 7});
  const Tensor y = m.targets({0, 1, 2, 0, 1, 2});
  for (int w = 0; w < 2; ++w) {  // warm the allocator's cache and the GEMM plans
    m.micro_step(good, y);
    m.micro_step(good, y);
    m.window.close();
  }
  ASSERT_EQ(m.window.report().optimizer_steps, 2);
  const Tensor master = m.arena.master().clone();

  auto stream = static_cast<cudaStream_t>(current_stream(0));
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  bool threw = false;
  try {
    m.micro_step(good, y);
    m.micro_step(bad, y);
    m.window.close();
  } catch (const Error& e) {
    threw = true;
    ADD_FAILURE() << "a synchronizing call inside the captured window: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_FALSE(threw);
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_GT(nodes, 10u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_ERROR(m.window.check(), "embedding", "index 7", "flat position 5", "[0, 7)");
  EXPECT_TRUE(m.window.report().skipped);
  EXPECT_TRUE(test::all_equal(m.arena.master(), master));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The detector works: without a Window the check is eager, reads its count
// back, and so cannot be captured. The failed synchronize is a CUDA API error
// that compute-sanitizer would count against the run, so tools/gpu_check.sh's
// sanitizer runs skip this test (the plain GPU suite runs it).
TEST(GpuDeferredIndexChecks, the_eager_check_cannot_be_captured) {
  ACCRUE_REQUIRE_CUDA();
  if (std::getenv("ACCRUE_UNDER_SANITIZER") != nullptr)
    GTEST_SKIP() << "provokes a CUDA API error on purpose (ACCRUE_UNDER_SANITIZER is set)";
  const Tensor weight = test::random_normal({5, 2}, DType::f32, kGpu);
  const Tensor idx = from_vector<int64_t>({1, 2}, {2}).to(kGpu);
  kernels::embedding(weight, idx);  // warm up outside the capture
  auto stream = static_cast<cudaStream_t>(current_stream(0));
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_THROW(kernels::embedding(weight, idx), Error);
  cudaGraph_t graph = nullptr;
  EXPECT_NE(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // the capture's error is not sticky; clear it for the next test
}

}  // namespace
}  // namespace accrue
