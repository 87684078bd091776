#include "examples/common/timing.h"

#include <algorithm>
#include <memory>

namespace accrue::examples {

double median(std::vector<double> v) {
  ACCRUE_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> time_windows(Device device, int64_t warmup, int64_t timed,
                                 const std::function<void()>& run_window) {
  std::vector<double> window_ms;
  for (int64_t w = 0; w < warmup; ++w)
    run_window();
  if (device.is_cuda()) {
    const StreamHandle stream = current_stream(device.index);
    std::vector<std::unique_ptr<Event>> marks;
    for (int64_t w = 0; w <= timed; ++w)
      marks.push_back(std::make_unique<Event>(/*timing=*/true));
    cuda_profiler_start();  // Note [Profiled span]: the timed windows only
    marks[0]->record(stream);
    for (int64_t w = 1; w <= timed; ++w) {
      run_window();
      marks[static_cast<size_t>(w)]->record(stream);
    }
    marks.back()->synchronize();
    cuda_profiler_stop();
    for (size_t w = 1; w < marks.size(); ++w)
      window_ms.push_back(marks[w - 1]->elapsed_ms(*marks[w]));
  } else {
    for (int64_t w = 0; w < timed; ++w) {
      const auto t0 = std::chrono::steady_clock::now();
      run_window();
      window_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return window_ms;
}

double Stopwatch::lap() {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  return seconds;
}

}  // namespace accrue::examples
