// graph_memsets/*: what a memset node costs the kernels around it in a CUDA
// graph replay. In GPT-2 124M's kernel trace at micro-batches 4 and 1 the
// device idled 2-5 us after the memsets that cuDNN's flash attention and
// cuBLASLt's split-K GEMMs capture before their kernels (bench/RESULTS.md,
// twentieth session), so the twenty-second session asked whether a memset
// node is what costs. One op is kReplays replays of a graph of kKernels short
// kernels, a 1 MiB memset (or its stand-in) before every kMemsetEvery-th:
//   no_memsets     the kernels alone;
//   memset_nodes   the memsets as captured (memset nodes);
//   disabled       the memset nodes disabled in the executable graph
//                  (cudaGraphNodeSetEnabled: an empty node; no bytes written);
//   fill_kernels   a kernel that writes the same bytes captured in place of
//                  each memset: no memset node at all.
// Counter us_per_kernel is the op's GPU time over its kReplays x kKernels
// short kernels; the cases differ only in what runs between them. On an H200
// (bench/RESULTS.md, twenty-second session): 1.218 / 1.488 / 1.340 / 1.475
// us, so a memset node costs about 1.1 us, as a fill kernel does, and an
// empty node 0.5 us: the memset nodes are not the trace's 2-5 us gaps, and
// replacing them (a fill kernel beside or after each disabled memset node,
// tried in the library and measured 1.589 and 1.686 us here, no faster for
// GPT-2) gains nothing.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue/core/status_check.h"
#include "bench/bench_util.h"
#include "bench/short_kernel_graphs.cuh"

namespace accrue::bench {
namespace {

using short_kernels::Graph;
using short_kernels::kBlocks;
using short_kernels::kKernels;
using short_kernels::kMemsetBytes;
using short_kernels::kMemsetEvery;
using short_kernels::kThreads;
using short_kernels::launch_short;

constexpr int kReplays = 8;

__global__ void zero_kernel(uint4* data, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    data[i] = make_uint4(0, 0, 0, 0);
}

enum class Case { no_memsets, memset_nodes, disabled, fill_kernels };

std::unique_ptr<Graph> capture(Case c, float* data, void* zeroed, cudaStream_t stream) {
  auto g = std::make_unique<Graph>();
  ACCRUE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kKernels; ++k) {
    if (k % kMemsetEvery == 0 && c != Case::no_memsets) {
      if (c == Case::fill_kernels) {
        zero_kernel<<<256, 256, 0, stream>>>(static_cast<uint4*>(zeroed), kMemsetBytes / 16);
        ACCRUE_LAUNCH_CHECK();
      } else {
        ACCRUE_CUDA_CHECK(cudaMemsetAsync(zeroed, 0, kMemsetBytes, stream));
      }
    }
    launch_short(data, stream);
  }
  ACCRUE_CUDA_CHECK(cudaStreamEndCapture(stream, &g->graph));
  ACCRUE_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  if (c == Case::disabled) {
    size_t n = 0;
    ACCRUE_CUDA_CHECK(cudaGraphGetNodes(g->graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    ACCRUE_CUDA_CHECK(cudaGraphGetNodes(g->graph, nodes.data(), &n));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      ACCRUE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      if (type == cudaGraphNodeTypeMemset)
        ACCRUE_CUDA_CHECK(cudaGraphNodeSetEnabled(g->exec, node, 0));
    }
  }
  return g;
}

void run_case(benchmark::State& state, Case c) {
  const Tensor buffer = random_input({kBlocks * kThreads}, DType::f32);
  const Tensor zeroed = random_input({static_cast<int64_t>(kMemsetBytes / 4)}, DType::f32);
  const auto stream = static_cast<cudaStream_t>(current_stream(kDevice));
  const std::unique_ptr<Graph> g =
      capture(c, static_cast<float*>(buffer.data_ptr()), zeroed.data_ptr(), stream);
  short_kernels::time_replays(state, g->exec, stream, kReplays);
}

}  // namespace

void register_graph_memset_benchmarks() {
  const std::pair<const char*, Case> cases[] = {{"no_memsets", Case::no_memsets},
                                                {"memset_nodes", Case::memset_nodes},
                                                {"disabled", Case::disabled},
                                                {"fill_kernels", Case::fill_kernels}};
  for (const auto& [name, c] : cases)
    register_gpu_benchmark(std::string("graph_memsets/") + name,
                           [c = c](benchmark::State& state) { run_case(state, c); });
}

}  // namespace accrue::bench
