#include "accrue/optim/metrics_log.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "accrue/core/error.h"

namespace accrue::optim {
namespace {

// A JSON number, or null when v is not finite (Note [Metrics log]).
std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char s[32];
  std::snprintf(s, sizeof s, "%.9g", v);
  return s;
}

}  // namespace

ZScore::ZScore(int window) : window_(window) {
  ACCRUE_CHECK(window >= 2, "ZScore: window must be >= 2, got ", window);
}

double ZScore::add(double value) {
  if (!std::isfinite(value)) return NAN;
  double z = NAN;
  if (values_.size() >= static_cast<size_t>(std::max(2, window_ / 4))) {
    double mean = 0.0;
    for (double v : values_)
      mean += v;
    mean /= static_cast<double>(values_.size());
    double var = 0.0;
    for (double v : values_)
      var += (v - mean) * (v - mean);
    var /= static_cast<double>(values_.size());
    if (var > 0.0) z = (value - mean) / std::sqrt(var);
  }
  if (values_.size() < static_cast<size_t>(window_)) {
    values_.push_back(value);
  } else {
    values_[next_] = value;
    next_ = (next_ + 1) % values_.size();
  }
  return z;
}

MetricsLog::MetricsLog(const std::string& path, bool append)
    : file_(std::fopen(path.c_str(), append ? "a" : "w"), &std::fclose) {
  ACCRUE_CHECK(file_ != nullptr, "MetricsLog: cannot open ", path, ": ", std::strerror(errno));
}

void MetricsLog::write(const WindowReport& r,
                       const std::vector<std::pair<std::string, double>>& extras) {
  if (!file_) return;
  std::string line = "{\"window\": " + std::to_string(r.window);
  auto field = [&](const char* key, const std::string& value) {
    line += ", \"";
    line += key;
    line += "\": ";
    line += value;
  };
  field("loss", number(r.loss));
  field("items", number(r.items));
  field("grad_norm", number(r.grad_norm));
  field("grad_norm_clipped", number(r.grad_norm * r.clip_coef));
  field("clip_coef", number(r.clip_coef));
  field("loss_scale", number(r.loss_scale));
  field("skipped", r.skipped ? "true" : "false");
  field("skipped_windows", std::to_string(r.skipped_windows));
  field("optimizer_steps", std::to_string(r.optimizer_steps));
  if (r.noise_windows > 0) {
    field("noise_grad_sq", number(r.grad_sq));
    field("noise_trace_sigma", number(r.trace_sigma));
    field("noise_scale", number(r.noise_scale));
  }
  for (const auto& [key, value] : extras)
    field(key.c_str(), number(value));
  line += "}\n";
  ACCRUE_CHECK(std::fputs(line.c_str(), file_.get()) >= 0 && std::fflush(file_.get()) == 0,
               "MetricsLog: cannot write window ", r.window, ": ", std::strerror(errno));
}

}  // namespace accrue::optim
