// stream_gap/*: does a second stream slow the kernels that follow on the
// current stream? The close under the forward (Note [Close under the
// forward] in optim/layer_steps.h) steps the parameters on a side stream, and
// on an H200 every micro-step after it ran about 0.2 ms slower: the kernels
// took the same time, the idle gaps between back-to-back kernels grew from
// about 0.1 us to 0.45 us (bench/RESULTS.md, fifth session). These cases
// reproduce that shape without the library: one op is R replays of a CUDA
// graph of N short kernels on the current stream, as a window's micro-steps
// are, and the first replay is preceded by
//   plain          nothing;
//   side_wait      a kernel on a second stream that the current stream then
//                  waits for (an event), as micro-step 0 waits for the steps;
//   side_no_wait   the same kernel on the second stream, no wait;
//   own_event      a wait on an event of the current stream itself (no second
//                  stream: the "ranges on the current stream" case);
//   forked_graph   nothing, but the first replay is of a graph that forks the
//                  side kernel onto a branch and joins it inside the graph;
//   forked_graph_last  the same graph as the last replay: enqueued long before
//                  the GPU reaches it, as micro-step 0's graph would be if the
//                  steps were a branch of it;
//   side_blocked   nothing; after the last replay the second stream waits for
//                  the current stream (an event) and then runs the kernel. The
//                  host enqueues that wait long before the GPU reaches the
//                  event, so the second stream sits blocked while the replays
//                  run: as the close's side stream, whose first op waits for
//                  the close's stages, is blocked while the host runs ahead;
//   side_blocked_paced  the same, but the host first waits until the GPU has
//                  begun the last replay (an event before it), so the second
//                  stream is blocked for one replay only;
//   side_graph     a one-kernel graph launched on the second stream, which the
//                  current stream then waits for: does a graph launch there cost
//                  what a kernel launch does?
//   side_memset    a cudaMemsetAsync on the second stream, then the wait: work
//                  that is not a kernel;
//   side_event     only an event recorded on the second stream and waited for;
//   side_alloc     a tensor allocated and freed from the stream-ordered pool
//                  while the second stream is current (no kernel on it);
//   branches       no second stream outside the graphs; each replay is of a
//                  graph of two independent chains of N/2 kernels, forked and
//                  joined inside it (as two micro-batches in flight would be):
//                  what concurrent branches of one graph cost or gain per kernel;
//   plain_memsets  nothing, but the replayed graph holds memset nodes (a 1 MiB
//                  memset before every fourth kernel, as cuDNN's and
//                  cuBLASLt's captured memsets sit in a micro-step's graph);
//   side_graph_memsets  that graph after side_graph's one-kernel graph on the
//                  second stream: in GPT-2's kernel trace at 4 x 8 the close
//                  under the forward (its steps a graph on the side stream)
//                  turned about 350 transitions a window into a memset node
//                  from under 2 us into about 3 us (bench/RESULTS.md,
//                  twenty-fifth session), in every micro-step's graph;
//   plain_again    nothing, registered last: if it is slower than plain in the
//                  same process, whatever a second stream changed persists.
// Counter us_per_kernel is the op's GPU time over its R x N kernels; the cases
// differ only in the gaps. Run each case in its own process as well
// (--benchmark_filter), since an effect that persists would reach the cases
// registered after it.
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
using short_kernels::kMemsetBytes;
using short_kernels::kMemsetEvery;
using short_kernels::kThreads;
using short_kernels::launch_short;

constexpr int kReplays = 32;  // K = 32

enum class Case {
  plain,
  side_wait,
  side_no_wait,
  own_event,
  forked_graph,
  forked_graph_last,
  side_blocked,
  side_blocked_paced,
  side_graph,
  side_memset,
  side_event,
  side_alloc,
  branches,
  plain_memsets,
  side_graph_memsets,
  plain_again
};

// Captures N kernels on `stream`; with `side`, the side kernel (on its own
// buffer) forks off first and joins before the eleventh; with `zeroed`, a
// memset of it before every kMemsetEvery-th kernel.
std::unique_ptr<Graph> capture(float* data, cudaStream_t stream, float* side_data,
                               cudaStream_t side, cudaEvent_t fork, cudaEvent_t join,
                               void* zeroed = nullptr) {
  return capture_on(stream, [&] {
    if (side) {
      ACCRUE_CUDA_CHECK(cudaEventRecord(fork, stream));
      ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
      launch_short(side_data, side);
      ACCRUE_CUDA_CHECK(cudaEventRecord(join, side));
    }
    for (int k = 0; k < kKernels; ++k) {
      if (side && k == 10) ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, join, 0));
      if (zeroed && k % kMemsetEvery == 0)
        ACCRUE_CUDA_CHECK(cudaMemsetAsync(zeroed, 0, kMemsetBytes, stream));
      launch_short(data, stream);
    }
  });
}

// Captures `kernels` kernels on `stream` and, with `side`, as many on the side
// stream beside them (forked at the start, joined at the end).
std::unique_ptr<Graph> capture_chains(float* data, cudaStream_t stream, int kernels,
                                      float* side_data, cudaStream_t side, cudaEvent_t fork,
                                      cudaEvent_t join) {
  return capture_on(stream, [&] {
    if (side) {
      ACCRUE_CUDA_CHECK(cudaEventRecord(fork, stream));
      ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    }
    for (int k = 0; k < kernels; ++k) {
      launch_short(data, stream);
      if (side) launch_short(side_data, side);
    }
    if (side) {
      ACCRUE_CUDA_CHECK(cudaEventRecord(join, side));
      ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(stream, join, 0));
    }
  });
}

void run_case(benchmark::State& state, Case c) {
  const Tensor buffer = random_input({kBlocks * kThreads}, DType::f32);
  const Tensor side_buffer = random_input({kBlocks * kThreads}, DType::f32);
  float* data = static_cast<float*>(buffer.data_ptr());
  float* side_data = static_cast<float*>(side_buffer.data_ptr());
  const StreamHandle stream = current_stream(kDevice);
  // Only the cases that use a second stream create one: plain and own_event
  // run in a process that never had one, when run alone.
  const bool uses_side = c != Case::plain && c != Case::own_event && c != Case::plain_again &&
                         c != Case::plain_memsets;
  const bool forks = c == Case::forked_graph || c == Case::forked_graph_last;
  const bool side_graph = c == Case::side_graph || c == Case::side_graph_memsets;
  const bool side_first = c == Case::side_wait || c == Case::side_no_wait || side_graph ||
                          c == Case::side_memset || c == Case::side_event || c == Case::side_alloc;
  const bool memsets = c == Case::plain_memsets || c == Case::side_graph_memsets;
  const Tensor zeroed =
      memsets ? random_input({static_cast<int64_t>(kMemsetBytes / 4)}, DType::f32) : Tensor();
  std::unique_ptr<Stream> side_stream = uses_side ? std::make_unique<Stream>(kDevice) : nullptr;
  const StreamHandle side = side_stream ? side_stream->handle() : nullptr;
  Event done, fork, join, pace;
  const std::unique_ptr<Graph> straight = capture(data, stream, nullptr, nullptr, nullptr, nullptr,
                                                  memsets ? zeroed.data_ptr() : nullptr);
  const std::unique_ptr<Graph> forked =
      forks ? capture(data, stream, side_data, side, fork.handle(), join.handle()) : nullptr;
  // side_graph's (and side_graph_memsets') one kernel, captured on the side stream.
  const std::unique_ptr<Graph> side_one =
      side_graph ? capture_chains(side_data, side, 1, nullptr, nullptr, nullptr, nullptr) : nullptr;
  const std::unique_ptr<Graph> two_chains =
      c == Case::branches ? capture_chains(data, stream, kKernels / 2, side_data, side,
                                           fork.handle(), join.handle())
                          : nullptr;
  const cudaGraphExec_t replayed = two_chains ? two_chains->exec : straight->exec;
  GpuTime t = time_gpu(state, [&] {
    for (int r = 0; r < kReplays; ++r) {
      if (r == 0 && side_first) {
        if (c == Case::side_wait || c == Case::side_no_wait) launch_short(side_data, side);
        if (side_graph) ACCRUE_CUDA_CHECK(cudaGraphLaunch(side_one->exec, side));
        if (c == Case::side_memset)
          ACCRUE_CUDA_CHECK(cudaMemsetAsync(side_data, 0, sizeof(float), side));
        if (c == Case::side_alloc) {
          const StreamGuard on_side(kDevice, side);
          (void)empty({1 << 20}, DType::f32, Device::cuda(kDevice));  // freed at once
        }
        done.record(side);
        if (c != Case::side_no_wait) done.block(stream);
      }
      if (r == 0 && c == Case::own_event) {
        done.record(stream);
        done.block(stream);
      }
      if (r == kReplays - 1 && c == Case::side_blocked_paced) pace.record(stream);
      const bool fork_now = (r == 0 && c == Case::forked_graph) ||
                            (r == kReplays - 1 && c == Case::forked_graph_last);
      ACCRUE_CUDA_CHECK(cudaGraphLaunch(fork_now ? forked->exec : replayed, stream));
    }
    if (c == Case::side_blocked || c == Case::side_blocked_paced) {
      if (c == Case::side_blocked_paced) pace.synchronize();
      done.record(stream);
      done.block(side);
      launch_short(side_data, side);
    }
  });
  if (side) ACCRUE_CUDA_CHECK(cudaStreamSynchronize(side));
  short_kernels::set_us_per_kernel(state, t, kReplays);
}

}  // namespace

void register_stream_gap_benchmarks() {
  const std::pair<const char*, Case> cases[] = {{"plain", Case::plain},
                                                {"side_wait", Case::side_wait},
                                                {"side_no_wait", Case::side_no_wait},
                                                {"own_event", Case::own_event},
                                                {"forked_graph", Case::forked_graph},
                                                {"forked_graph_last", Case::forked_graph_last},
                                                {"side_blocked", Case::side_blocked},
                                                {"side_blocked_paced", Case::side_blocked_paced},
                                                {"side_graph", Case::side_graph},
                                                {"side_memset", Case::side_memset},
                                                {"side_event", Case::side_event},
                                                {"side_alloc", Case::side_alloc},
                                                {"branches", Case::branches},
                                                {"plain_memsets", Case::plain_memsets},
                                                {"side_graph_memsets", Case::side_graph_memsets},
                                                {"plain_again", Case::plain_again}};
  for (const auto& [name, c] : cases)
    register_gpu_benchmark(std::string("stream_gap/") + name,
                           [c = c](benchmark::State& state) { run_case(state, c); });
}

}  // namespace accrue::bench
