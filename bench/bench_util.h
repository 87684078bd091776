// The harness shared by accrue's Google Benchmark binaries: GPU timing with
// CUDA events, the counters the field compares (GB/s, TFLOP/s, fraction of
// the measured copy bandwidth) and random inputs.
//
// Each bench_*.cpp registers its benchmarks through one register_* function
// declared here; main.cpp calls them all.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <string>

#include "accrue/core/cuda_runtime.h"
#include "accrue/core/tensor.h"

namespace accrue::bench {

// Every benchmark runs on this device, on accrue's current stream for it.
constexpr int kDevice = 0;
inline Device gpu() {
  return Device::cuda(kDevice);
}

// Note [GPU timing]
// ~~~~~~~~~~~~~~~~~
// One benchmark iteration times one call of the op with two CUDA events on
// the current stream, and that GPU time is what Google Benchmark records
// (UseManualTime). Before the start event a spin kernel keeps the GPU busy
// for longer than the host takes to enqueue the op (measured during the
// warm-up), so the GPU runs start event, op, end event back to back: the
// events measure the op's kernels, not the host's dispatch and launch
// latency. torch_bench.py does the same with torch.cuda._sleep, so both
// sides measure the same thing. Every benchmark warms up first (cuBLASLt
// heuristics, allocator pools, clocks) and draws fresh random inputs.
struct GpuTime {
  double seconds = 0;  // GPU time summed over the timed iterations
  int64_t ops = 0;     // timed calls of the op
};
GpuTime time_gpu(benchmark::State& state, const std::function<void()>& op);

// Counters GB/s (bytes read + written per op), copy_frac (that rate over
// copy_bandwidth()) and bytes. Rates are computed here from the GPU time:
// Google Benchmark's own kIsRate counters divide by CPU time.
void report_bandwidth(benchmark::State& state, double bytes_per_op, const GpuTime& t);
// Counters TFLOP/s and flop.
void report_flops(benchmark::State& state, double flop_per_op, const GpuTime& t);

// The device-to-device copy bandwidth in bytes/s (read + write counted), the
// practical memory floor every bandwidth-bound op is compared with. Measured
// once per process: cudaMemcpyAsync of 1 GiB, median of 10 timed copies.
double copy_bandwidth();
// One timed device-to-device copy of `bytes` bytes, in seconds (see Note [GPU timing]).
double time_copy_once(void* dst, const void* src, size_t bytes);

// Standard-normal values (never zeros: zeros flatter some kernels).
Tensor random_input(const Shape& shape, DType dtype);

// Enqueues a one-thread kernel that busy-waits `microseconds` on `stream`
// (bench/gpu_spin.cu).
void spin_gpu(StreamHandle stream, double microseconds);

// Registers `fn` as a GPU benchmark: manual time, milliseconds, and any
// accrue::Error or other exception reported as a skipped benchmark.
benchmark::internal::Benchmark* register_gpu_benchmark(const std::string& name,
                                                       std::function<void(benchmark::State&)> fn);

void register_copy_benchmarks();
void register_elementwise_benchmarks();
void register_reduce_benchmarks();
void register_matmul_benchmarks();
void register_model_op_benchmarks();
void register_attention_benchmarks();
void register_fused_benchmarks();
void register_stream_gap_benchmarks();      // bench_stream_gap.cu
void register_graph_memset_benchmarks();    // bench_graph_memsets.cu
void register_graph_carveout_benchmarks();  // bench_graph_carveout.cu

}  // namespace accrue::bench
