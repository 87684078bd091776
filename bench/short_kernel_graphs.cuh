// What bench_stream_gap.cu, bench_graph_memsets.cu and bench_graph_carveout.cu
// replay: short kernels of a few us each, as a small micro-step's are, in
// captured CUDA graphs, and how their replays are timed.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "accrue/core/status_check.h"
#include "bench/bench_util.h"

namespace accrue::bench::short_kernels {
namespace {  // each including file gets its own kernel

constexpr int kKernels = 480;  // about one GPT-2 124M micro-step's kernels
constexpr int kBlocks = 132, kThreads = 256;
constexpr int kSteps = 64;  // each thread's dependent updates: a kernel of a few us
// The graphs with memset nodes: a memset of kMemsetBytes before every
// kMemsetEvery-th kernel, as cuDNN's flash attention and cuBLASLt's split-K
// GEMMs capture theirs before their kernels.
constexpr int kMemsetEvery = 4;
constexpr size_t kMemsetBytes = 1 << 20;

__global__ void short_kernel(float* data, int n, int steps) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = data[i];
  for (int k = 0; k < steps; ++k)
    v = v * 0.999f + 0.001f;
  data[i] = v;
}

// One short kernel over data's kBlocks x kThreads floats.
inline void launch_short(float* data, cudaStream_t stream) {
  short_kernel<<<kBlocks, kThreads, 0, stream>>>(data, kBlocks * kThreads, kSteps);
  ACCRUE_LAUNCH_CHECK();
}

// A captured graph and its executable, destroyed together.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Counter us_per_kernel: the GPU time of `t` over its ops' replays x kKernels kernels.
inline void set_us_per_kernel(benchmark::State& state, const GpuTime& t, int replays) {
  state.counters["us_per_kernel"] =
      t.ops > 0 ? t.seconds * 1e6 / (static_cast<double>(t.ops) * replays * kKernels) : 0;
}

// Times ops of `replays` launches of `exec` on `stream`; sets us_per_kernel.
inline void time_replays(benchmark::State& state, cudaGraphExec_t exec, cudaStream_t stream,
                         int replays) {
  const GpuTime t = time_gpu(state, [&] {
    for (int r = 0; r < replays; ++r)
      ACCRUE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  });
  set_us_per_kernel(state, t, replays);
}

// Records what `body` launches on `stream` into an instantiated graph.
template <class Body>
std::unique_ptr<Graph> capture_on(cudaStream_t stream, Body&& body) {
  auto g = std::make_unique<Graph>();
  ACCRUE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  ACCRUE_CUDA_CHECK(cudaStreamEndCapture(stream, &g->graph));
  ACCRUE_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  return g;
}

}  // namespace
}  // namespace accrue::bench::short_kernels
