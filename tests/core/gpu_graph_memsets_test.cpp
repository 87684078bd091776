// Note [Memset nodes as kernels] (core/graph_memsets.cu): a graph whose memset
// nodes became fill kernels writes the same bytes, in the same order against
// the nodes around them, as the graph it came from.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "accrue/core/cuda_graph.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/graph_memsets.h"
#include "accrue/core/status_check.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

constexpr size_t kBytes = 1 << 16;

struct MemsetCase {
  size_t offset;  // bytes into the buffer
  unsigned element_size;
  unsigned value;
  size_t width;  // elements a row
  size_t height;
  size_t pitch;  // bytes between rows
};

// Every word width of the fill kernel: 16-byte words, 4, 2 and 1 byte, one
// row and several.
const MemsetCase kCases[] = {
    {0, 4, 0x3f800000u, 1024, 1, 0},     // 16-byte words
    {4096, 4, 0xdeadbeefu, 33, 7, 160},  // 4-byte words (33 elements a row), 2-D
    {8194, 2, 0xabcdu, 777, 1, 0},       // 2-byte words
    {12291, 1, 0x1a5u, 1001, 1, 0},      // 1-byte words at an odd address, value 0xa5
    {16384, 1, 0x7fu, 64, 5, 80},        // 2-D bytes in 16-byte words
    {20480, 2, 0xffffu, 5, 9, 14},       // 2-D, a pitch that only 2-byte words fit
};

void apply_on_host(std::vector<uint8_t>& bytes, const MemsetCase& c) {
  for (size_t r = 0; r < c.height; ++r)
    for (size_t e = 0; e < c.width; ++e)
      for (unsigned b = 0; b < c.element_size; ++b)
        bytes[c.offset + r * c.pitch + e * c.element_size + b] =
            static_cast<uint8_t>(c.value >> (8 * b));
}

// copy in -> every memset, in two parallel branches -> copy out; returns the
// bytes copied out after one launch, with fill kernels in place of the memsets or not.
std::vector<uint8_t> run_graph(const std::vector<uint8_t>& initial, bool rewrite,
                               detail::FillPlacement placement, int64_t* replaced) {
  uint8_t *init = nullptr, *work = nullptr, *out = nullptr;
  ACCRUE_CUDA_CHECK(cudaMalloc(&init, kBytes));
  ACCRUE_CUDA_CHECK(cudaMalloc(&work, kBytes));
  ACCRUE_CUDA_CHECK(cudaMalloc(&out, kBytes));
  ACCRUE_CUDA_CHECK(cudaMemcpy(init, initial.data(), kBytes, cudaMemcpyHostToDevice));
  ACCRUE_CUDA_CHECK(cudaMemset(work, 0, kBytes));
  ACCRUE_CUDA_CHECK(cudaMemset(out, 0, kBytes));
  cudaGraph_t graph = nullptr;
  ACCRUE_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t copy_in = nullptr, copy_out = nullptr;
  ACCRUE_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy_in, graph, nullptr, 0, work, init, kBytes,
                                             cudaMemcpyDeviceToDevice));
  // Two branches after copy_in, each a chain of memsets; copy_out waits for both.
  cudaGraphNode_t last[2] = {copy_in, copy_in};
  int i = 0;
  for (const MemsetCase& c : kCases) {
    cudaMemsetParams p = {};
    p.dst = work + c.offset;
    p.elementSize = c.element_size;
    p.value = c.value;
    p.width = c.width;
    p.height = c.height;
    p.pitch = c.pitch;
    cudaGraphNode_t node = nullptr;
    ACCRUE_CUDA_CHECK(cudaGraphAddMemsetNode(&node, graph, &last[i % 2], 1, &p));
    last[i % 2] = node;
    ++i;
  }
  ACCRUE_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy_out, graph, last, 2, out, work, kBytes,
                                             cudaMemcpyDeviceToDevice));
  std::vector<void*> memsets;
  if (rewrite) memsets = detail::add_fill_kernels(graph, placement);
  *replaced = static_cast<int64_t>(memsets.size());
  cudaGraphExec_t exec = nullptr;
  ACCRUE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  detail::disable_nodes(exec, memsets);
  ACCRUE_CUDA_CHECK(cudaGraphLaunch(exec, nullptr));
  ACCRUE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> result(kBytes);
  ACCRUE_CUDA_CHECK(cudaMemcpy(result.data(), out, kBytes, cudaMemcpyDeviceToHost));
  ACCRUE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ACCRUE_CUDA_CHECK(cudaGraphDestroy(graph));
  for (uint8_t* p : {init, work, out})
    ACCRUE_CUDA_CHECK(cudaFree(p));
  return result;
}

TEST(GpuGraphMemsets, fill_kernels_write_the_memsets_bytes_between_the_same_nodes) {
  ACCRUE_REQUIRE_CUDA();
  set_cuda_device(0);
  std::mt19937 rng(20261129);
  std::vector<uint8_t> initial(kBytes);
  for (uint8_t& b : initial)
    b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> expected = initial;
  for (const MemsetCase& c : kCases)
    apply_on_host(expected, c);

  int64_t replaced = 0;
  const std::vector<uint8_t> kept =
      run_graph(initial, /*rewrite=*/false, detail::FillPlacement::beside, &replaced);
  EXPECT_EQ(replaced, 0);
  for (size_t b = 0; b < kBytes; ++b)
    ASSERT_EQ(kept[b], expected[b]) << "the memset nodes themselves, byte " << b;

  for (detail::FillPlacement placement :
       {detail::FillPlacement::beside, detail::FillPlacement::after}) {
    SCOPED_TRACE(placement == detail::FillPlacement::beside ? "beside" : "after");
    const std::vector<uint8_t> fills = run_graph(initial, /*rewrite=*/true, placement, &replaced);
    EXPECT_EQ(replaced, static_cast<int64_t>(std::size(kCases)));
    for (size_t b = 0; b < kBytes; ++b)
      ASSERT_EQ(fills[b], expected[b]) << "the fill kernels, byte " << b;
  }
}

TEST(GpuGraphMemsets, a_captured_memset_replays_as_a_fill_before_the_copy_that_reads_it) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor filled = empty({4099}, DType::f32, gpu);
  const Tensor result = empty({4099}, DType::f32, gpu);
  auto body = [&] {
    ACCRUE_CUDA_CHECK(cudaMemsetAsync(filled.data_ptr(), 0x3f, 4099 * sizeof(float),
                                      static_cast<cudaStream_t>(current_stream(0))));
    // An allocation inside the capture: the graph holds memory nodes, which
    // forbid destroying a node (the memset is disabled instead).
    const Tensor staged = empty({4099}, DType::f32, gpu);
    staged.copy_(filled);
    result.copy_(staged);
  };
  std::string why;
  const std::unique_ptr<CudaGraph> graph = CudaGraph::capture(0, body, &why);
  ASSERT_TRUE(graph) << why;
  EXPECT_EQ(graph->fills(), 1);
  filled.copy_(test::random_normal({4099}, DType::f32, gpu));  // other bits before the replay
  graph->launch();
  const Tensor expected = empty({4099}, DType::f32, Device::cpu());
  std::memset(expected.data_ptr(), 0x3f, 4099 * sizeof(float));
  EXPECT_TRUE(test::all_equal(result.to(Device::cpu()), expected));
}

}  // namespace
}  // namespace accrue
