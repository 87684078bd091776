// graph_carveout/*: what a change of the SM's shared-memory carveout costs
// between two kernels of a CUDA graph replay. In GPT-2 124M's kernel trace at
// micro-batches 4 and 1 the device idled 2-5 us before cuDNN's flash kernels
// and cuBLASLt's large-tile GEMMs (bench/RESULTS.md, twentieth session), and
// the twenty-second session ruled out the memsets before them (graph_memsets).
// Those kernels take most of an SM's 228 KiB as shared memory, the small
// kernels between them almost none: an SM must drain before its L1/shared
// split changes. One op is kReplays replays of a graph of kKernels kernels of
// the same few us of work each:
//   small_only            kernels without shared memory;
//   large_only            kernels that each take kLargeShared of shared memory;
//   alternating           the two in turn, the small one at the default carveout;
//   small_max_shared      in turn, the small one asking for the most shared
//                         memory (cudaFuncAttributePreferredSharedMemoryCarveout);
//   small_max_l1          in turn, the small one asking for the most L1 (so
//                         the split must change at every kernel);
//   device_prefer_shared  in turn, the device's cache config set to prefer
//                         shared memory before the capture (cudaDeviceSetCacheConfig).
// Counter us_per_kernel is the op's GPU time over its kReplays x kKernels
// kernels. Each case launches kernels of its own (a template tag), so one
// case's function attributes never reach another's.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>

#include "accrue/core/status_check.h"
#include "bench/bench_util.h"
#include "bench/short_kernel_graphs.cuh"

namespace accrue::bench {
namespace {

using short_kernels::capture_on;
using short_kernels::Graph;
using short_kernels::kBlocks;
using short_kernels::kKernels;
using short_kernels::kSteps;
using short_kernels::kThreads;

constexpr int kReplays = 8;
constexpr int kLargeShared = 160 * 1024;  // as a flash kernel's or a 256 x 128 GEMM tile's

// The short kernel's work; with shared memory, each thread also passes its
// value through its own shared word, so the allocation is used.
template <int Tag, bool Shared>
__global__ void carveout_kernel(float* data, int n, int steps) {
  extern __shared__ float scratch[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = data[i];
  for (int k = 0; k < steps; ++k)
    v = v * 0.999f + 0.001f;
  if constexpr (Shared) {
    scratch[threadIdx.x] = v;
    __syncwarp();
    v = scratch[threadIdx.x];
  }
  data[i] = v;
}

enum class Case {
  small_only,
  large_only,
  alternating,
  small_max_shared,
  small_max_l1,
  device_prefer_shared
};

template <int Tag, bool Shared>
void launch(float* data, cudaStream_t stream) {
  carveout_kernel<Tag, Shared>
      <<<kBlocks, kThreads, Shared ? kLargeShared : 0, stream>>>(data, kBlocks * kThreads, kSteps);
  ACCRUE_LAUNCH_CHECK();
}

template <int Tag>
std::unique_ptr<Graph> capture_case(Case c, float* data, cudaStream_t stream) {
  ACCRUE_CUDA_CHECK(cudaFuncSetAttribute(
      carveout_kernel<Tag, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kLargeShared));
  if (c == Case::small_max_shared || c == Case::small_max_l1)
    ACCRUE_CUDA_CHECK(cudaFuncSetAttribute(
        carveout_kernel<Tag, false>, cudaFuncAttributePreferredSharedMemoryCarveout,
        c == Case::small_max_shared ? cudaSharedmemCarveoutMaxShared : cudaSharedmemCarveoutMaxL1));
  return capture_on(stream, [&] {
    for (int k = 0; k < kKernels; ++k) {
      const bool large = c == Case::large_only || (c != Case::small_only && k % 2 == 1);
      if (large)
        launch<Tag, true>(data, stream);
      else
        launch<Tag, false>(data, stream);
    }
  });
}

std::unique_ptr<Graph> capture(Case c, float* data, cudaStream_t stream) {
  switch (c) {
    case Case::small_only:
      return capture_case<0>(c, data, stream);
    case Case::large_only:
      return capture_case<1>(c, data, stream);
    case Case::alternating:
      return capture_case<2>(c, data, stream);
    case Case::small_max_shared:
      return capture_case<3>(c, data, stream);
    case Case::small_max_l1:
      return capture_case<5>(c, data, stream);
    case Case::device_prefer_shared:
      break;
  }
  return capture_case<4>(c, data, stream);
}

void run_case(benchmark::State& state, Case c) {
  const Tensor buffer = random_input({kBlocks * kThreads}, DType::f32);
  const auto stream = static_cast<cudaStream_t>(current_stream(kDevice));
  cudaFuncCache previous = cudaFuncCachePreferNone;
  if (c == Case::device_prefer_shared) {
    ACCRUE_CUDA_CHECK(cudaDeviceGetCacheConfig(&previous));
    ACCRUE_CUDA_CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
  }
  const std::unique_ptr<Graph> g = capture(c, static_cast<float*>(buffer.data_ptr()), stream);
  short_kernels::time_replays(state, g->exec, stream, kReplays);
  if (c == Case::device_prefer_shared) ACCRUE_CUDA_CHECK(cudaDeviceSetCacheConfig(previous));
}

}  // namespace

void register_graph_carveout_benchmarks() {
  const std::pair<const char*, Case> cases[] = {
      {"small_only", Case::small_only},     {"large_only", Case::large_only},
      {"alternating", Case::alternating},   {"small_max_shared", Case::small_max_shared},
      {"small_max_l1", Case::small_max_l1}, {"device_prefer_shared", Case::device_prefer_shared}};
  for (const auto& [name, c] : cases)
    register_gpu_benchmark(std::string("graph_carveout/") + name,
                           [c = c](benchmark::State& state) { run_case(state, c); });
}

}  // namespace accrue::bench
