// The reference: a device-to-device cudaMemcpyAsync of 1 GiB. Its rate
// (bytes read + written) is the practical memory floor that every
// bandwidth-bound op is reported against as copy_frac.
#include <cuda_runtime_api.h>

#include "bench/bench_util.h"
#include "core/status_check.h"

namespace accrue::bench {

void register_copy_benchmarks() {
  register_gpu_benchmark("copy/d2d/1GiB", [](benchmark::State& state) {
    constexpr int64_t kFloats = int64_t{1} << 28;
    constexpr size_t kBytes = static_cast<size_t>(kFloats) * sizeof(float);
    Tensor src = random_input({kFloats}, DType::f32);
    Tensor dst = empty({kFloats}, DType::f32, gpu());
    StreamHandle stream = current_stream(kDevice);
    GpuTime t = time_gpu(state, [&] {
      ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), kBytes,
                                        cudaMemcpyDeviceToDevice, stream));
    });
    report_bandwidth(state, 2.0 * kBytes, t);
  });
}

}  // namespace accrue::bench
