#include "bench/bench_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "accrue/core/random.h"
#include "accrue/core/status_check.h"

namespace accrue::bench {
namespace {

constexpr int kWarmupCalls = 3;
// Bounds of the spin before each timed call (see Note [GPU timing]).
constexpr double kMinSpinMicroseconds = 100;
constexpr double kMaxSpinMicroseconds = 20000;

// Host seconds to enqueue one call of op (no synchronization inside).
double host_enqueue_seconds(const std::function<void()>& op) {
  auto begin = std::chrono::steady_clock::now();
  op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace

GpuTime time_gpu(benchmark::State& state, const std::function<void()>& op) {
  StreamHandle stream = current_stream(kDevice);
  // Warm-up; the slowest enqueue after the first (which may build plans or
  // grow pools) sizes the spin, with a 2x margin.
  double enqueue = 0;
  for (int i = 0; i < kWarmupCalls; ++i) {
    double s = host_enqueue_seconds(op);
    if (i > 0) enqueue = std::max(enqueue, s);
    synchronize_stream(stream);
  }
  const double spin_us = std::clamp(2e6 * enqueue, kMinSpinMicroseconds, kMaxSpinMicroseconds);

  Event start(/*timing=*/true);
  Event end(/*timing=*/true);
  GpuTime total;
  for (auto _ : state) {
    spin_gpu(stream, spin_us);
    start.record(stream);
    op();
    end.record(stream);
    end.synchronize();
    const double seconds = start.elapsed_ms(end) * 1e-3;
    state.SetIterationTime(seconds);
    total.seconds += seconds;
    total.ops += 1;
  }
  return total;
}

void report_bandwidth(benchmark::State& state, double bytes_per_op, const GpuTime& t) {
  if (t.ops == 0 || t.seconds <= 0) return;
  const double bytes_per_s = bytes_per_op * static_cast<double>(t.ops) / t.seconds;
  state.counters["GB/s"] = bytes_per_s * 1e-9;
  state.counters["copy_frac"] = bytes_per_s / copy_bandwidth();
  state.counters["bytes"] = bytes_per_op;
}

void report_flops(benchmark::State& state, double flop_per_op, const GpuTime& t) {
  if (t.ops == 0 || t.seconds <= 0) return;
  state.counters["TFLOP/s"] = flop_per_op * static_cast<double>(t.ops) / t.seconds * 1e-12;
  state.counters["flop"] = flop_per_op;
}

double time_copy_once(void* dst, const void* src, size_t bytes) {
  StreamHandle stream = current_stream(kDevice);
  Event start(/*timing=*/true);
  Event end(/*timing=*/true);
  spin_gpu(stream, kMinSpinMicroseconds);
  start.record(stream);
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  end.record(stream);
  end.synchronize();
  return start.elapsed_ms(end) * 1e-3;
}

double copy_bandwidth() {
  static const double measured = [] {
    constexpr int64_t kFloats = int64_t{1} << 28;  // 1 GiB
    constexpr size_t kBytes = static_cast<size_t>(kFloats) * sizeof(float);
    Tensor src = random_input({kFloats}, DType::f32);
    Tensor dst = empty({kFloats}, DType::f32, gpu());
    for (int i = 0; i < kWarmupCalls; ++i)
      time_copy_once(dst.data_ptr(), src.data_ptr(), kBytes);
    std::vector<double> seconds;
    for (int i = 0; i < 10; ++i)
      seconds.push_back(time_copy_once(dst.data_ptr(), src.data_ptr(), kBytes));
    std::nth_element(seconds.begin(), seconds.begin() + 5, seconds.end());
    return 2.0 * static_cast<double>(kBytes) / seconds[5];
  }();
  return measured;
}

Tensor random_input(const Shape& shape, DType dtype) {
  return randn(shape, dtype, gpu());
}

benchmark::internal::Benchmark* register_gpu_benchmark(const std::string& name,
                                                       std::function<void(benchmark::State&)> fn) {
  auto guarded = [fn = std::move(fn)](benchmark::State& state) {
    // An op that throws (not implemented yet, out of memory) skips its row
    // with the message instead of ending the whole run.
    try {
      fn(state);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  };
  return benchmark::RegisterBenchmark(name.c_str(), guarded)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace accrue::bench
