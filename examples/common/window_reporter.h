// The trainers' progress line of each window and its --metrics row: loss,
// gradient norm, learning rate, tokens/s, MFU, peak memory, skipped windows,
// the f16 loss scale, the gradient noise scale, and z-score alerts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "accrue.h"
#include "examples/common/bench_line.h"
#include "examples/common/timing.h"

namespace accrue::examples {

// The progress line of each window, and its --metrics row.
class WindowReporter {
 public:
  WindowReporter(int64_t windows, int64_t window_tokens, DType compute, Device device,
                 double flops_token, double peak_flops, int world_size)
      : windows_(windows),
        window_tokens_(window_tokens),
        compute_(compute),
        device_(device),
        flops_token_(flops_token),
        peak_(peak_flops),
        world_size_(world_size) {}

  // Model FLOPs utilization at this rate, NaN when the peak is unknown.
  double mfu(double tokens_per_s) const;

  // Prints window w's progress line (rate since the previous call); an ALERT
  // when the loss or gradient norm is 3 standard deviations off the last 128
  // windows.
  void print(int64_t w, const optim::WindowReport& r, double lr);

  // The --metrics extras of the window print() showed.
  std::vector<std::pair<std::string, double>> extras(double val_loss) const;

 private:
  int64_t windows_, window_tokens_;
  DType compute_;
  Device device_;
  double flops_token_, peak_;
  int world_size_;
  Stopwatch clock_;
  optim::ZScore loss_z_score_, norm_z_score_;
  double lr_ = 0, tokens_per_s_ = 0, loss_z_ = 0, norm_z_ = 0;
};

}  // namespace accrue::examples
