// Timing windows for the benchmarks (accrue_train_gpt2 --bench,
// accrue_resnet_bench) and the trainers' progress lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "accrue.h"

namespace accrue::examples {

double median(std::vector<double> v);

// Runs `warmup` untimed windows, then `timed` windows, and returns each timed
// window's milliseconds: from CUDA events on the device's current stream
// (the host does not wait between windows), or from the host clock on the
// CPU, whose backend runs synchronously.
std::vector<double> time_windows(Device device, int64_t warmup, int64_t timed,
                                 const std::function<void()>& run_window);

// Seconds between laps (a progress line's rate).
class Stopwatch {
 public:
  double lap();

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace accrue::examples
