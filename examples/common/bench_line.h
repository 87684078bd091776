// What the trainers' --bench prints (accrue_train_gpt2, accrue_train): the
// device's name and peak, the memory in use, and the keys every --bench JSON
// line begins with, which bench/*.py parse.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accrue.h"
#include "examples/common/json.h"

namespace accrue::examples {

// The GPU's name, or "CPU".
std::string device_name(Device device);

// Peak dense bf16 FLOP/s for MFU (--peak-tflops, or known from the device's
// name), or 0 when unknown (MFU is then "n/a").
double peak_flops(const std::optional<double>& peak_tflops, Device device, const std::string& name);

// Bytes in use on the device (all processes), or -1 on the CPU.
int64_t device_bytes_in_use(Device device);

// Model FLOPs utilization: tokens/s over all ranks x FLOPs per token over
// the peak of all ranks; NaN when the peak is unknown (0).
double model_flops_utilization(double tokens_per_s, double flops_per_token, double peak_flops,
                               int world_size);

// One --bench run: the timed windows (time_windows) and what they were.
struct BenchTiming {
  std::vector<double> window_ms;
  int64_t window_tokens = 0;  // over all ranks
  double flops_per_token = 0;
  double peak_flops = 0;  // 0: unknown
  int world_size = 1;
  double final_loss = 0;
};

// The keys every trainer's --bench line begins with, in this order: bench,
// device, world_size, tokens_per_s_median, window_ms_median, window_ms_min,
// peak_memory_bytes, device_memory_in_use_bytes (null on the CPU), mfu,
// flops_per_token, peak_flops (null when unknown), final_loss. The trainer
// adds its own keys and its "config" object after them.
JsonObject bench_summary(const std::string& bench, Device device, const BenchTiming& t);

}  // namespace accrue::examples
