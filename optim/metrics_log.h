// MetricsLog: the health monitor's file, one JSON line per window.
//
// Note [Metrics log]
// ~~~~~~~~~~~~~~~~~~
// The host writes a line after it has read the window's report (the one
// synchronization a window needs anyway), so logging adds no device work.
// A line holds the report (loss, N, the gradient norm before and after
// clipping and the clip coefficient, the loss scale, whether the window was
// skipped and how many were, the optimizer steps, and the gradient noise
// scale's estimates when measured) and whatever the caller measured around
// it (learning rate, tokens/s, MFU, peak memory, validation loss). A number
// that is not finite is written as null, so every line parses as JSON.
// tools/plot_metrics.py draws a file. Used by accrue_train_gpt2 and
// accrue_demo (--metrics FILE).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accrue/optim/window.h"

namespace accrue::optim {

// The z-score of each new value against the `window` values before it (as
// llm.c's outlier detector): NaN until a quarter of the window (at least
// two values) is in, so the first windows of a run raise no alert; NaN when
// they are all equal, or when the new value is not finite (a skipped window
// says so itself). Non-finite values are not added.
class ZScore {
 public:
  explicit ZScore(int window = 128);
  double add(double value);

 private:
  int window_;
  std::vector<double> values_;  // a ring of the last `window_` finite values
  size_t next_ = 0;
};

class MetricsLog {
 public:
  MetricsLog() = default;  // closed: write() does nothing
  // Truncates the file, or appends to it (a resumed run continues its log).
  MetricsLog(const std::string& path, bool append);

  bool is_open() const { return file_ != nullptr; }
  // One line for window r.window: the report's fields, then `extras` in order.
  void write(const WindowReport& r, const std::vector<std::pair<std::string, double>>& extras = {});

 private:
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
};

}  // namespace accrue::optim
