#include "examples/common/bench_line.h"

#include <algorithm>
#include <cmath>

#include "examples/common/timing.h"
#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "accrue/core/status_check.h"
#endif

namespace accrue::examples {

std::string device_name(Device device) {
#ifdef ACCRUE_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
    return prop.name;
  }
#endif
  (void)device;
  return "CPU";
}

double peak_flops(const std::optional<double>& peak_tflops, Device device,
                  const std::string& name) {
  if (peak_tflops) return *peak_tflops * 1e12;
  if (!device.is_cuda()) return 0.0;
  // H100 SXM and H200 SXM: 989.4 TFLOP/s dense bf16; the PCIe and NVL cards are slower.
  const bool hopper =
      name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (hopper && name.find("PCIe") != std::string::npos) return 756e12;
  if (hopper && name.find("NVL") != std::string::npos) return 835e12;
  return hopper ? 989e12 : 0.0;
}

int64_t device_bytes_in_use(Device device) {
#ifdef ACCRUE_WITH_CUDA
  if (device.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    ACCRUE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes - free_bytes);
  }
#endif
  (void)device;
  return -1;
}

double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_flops,
                               int world_size) {
  return peak_flops > 0 ? tokens_per_s * flops_per_token / (peak_flops * world_size) : NAN;
}

JsonObject bench_summary(const std::string& bench, Device device, const BenchTiming& t) {
  const double ms = median(t.window_ms);
  const double tokens_per_s = t.window_tokens / (ms / 1000.0);
  JsonObject line;
  line.text("bench", bench)
      .text("device", device_name(device))
      .integer("world_size", t.world_size)
      .number("tokens_per_s_median", tokens_per_s)
      .number("window_ms_median", ms)
      .number("window_ms_min", *std::min_element(t.window_ms.begin(), t.window_ms.end()))
      .integer("peak_memory_bytes", memory_stats(device).peak_bytes);
  if (device.is_cuda()) {
    line.integer("device_memory_in_use_bytes", device_bytes_in_use(device));
  } else {
    line.null("device_memory_in_use_bytes");
  }
  line.number("mfu",
              model_flops_utilization(tokens_per_s, t.flops_per_token, t.peak_flops, t.world_size))
      .number("flops_per_token", t.flops_per_token)
      .number("peak_flops", t.peak_flops > 0 ? t.peak_flops : NAN)
      .number("final_loss", t.final_loss);
  return line;
}

}  // namespace accrue::examples
