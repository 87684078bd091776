#include "examples/common/window_reporter.h"

#include <cmath>
#include <cstdio>

namespace accrue::examples {

double WindowReporter::mfu(double tokens_per_s) const {
  return model_flops_utilization(tokens_per_s, flops_token_, peak_, world_size_);
}

void WindowReporter::print(int64_t w, const optim::WindowReport& r, double lr) {
  lr_ = lr;
  tokens_per_s_ = window_tokens_ / clock_.lap();
  const double m = mfu(tokens_per_s_);
  char mfu_text[16] = "n/a";
  if (!std::isnan(m)) std::snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100 * m);
  const int64_t in_use = device_bytes_in_use(device_);
  char scale_text[32] = "";
  if (compute_ == DType::f16)
    std::snprintf(scale_text, sizeof(scale_text), " | scale %g", r.loss_scale);
  loss_z_ = loss_z_score_.add(r.loss);
  norm_z_ = norm_z_score_.add(r.grad_norm);
  char noise_text[48] = "";
  if (r.noise_windows > 0)
    std::snprintf(noise_text, sizeof(noise_text), " | noise scale %.4g", r.noise_scale);
  char alert_text[64] = "";
  if (std::fabs(loss_z_) >= 3.0 || std::fabs(norm_z_) >= 3.0)
    std::snprintf(alert_text, sizeof(alert_text), " | ALERT z: loss %.1f, grad-norm %.1f", loss_z_,
                  norm_z_);
  std::printf(
      "window %lld/%lld | loss %.4f | grad-norm %.4f | lr %.3e | %.0f tok/s | MFU %s | "
      "peak %s%s | skipped %lld%s%s%s\n",
      (long long)w, (long long)windows_, r.loss, r.grad_norm, lr, tokens_per_s_, mfu_text,
      mib(memory_stats(device_).peak_bytes).c_str(),
      in_use >= 0 ? (" (device " + mib(in_use) + " in use)").c_str() : "",
      (long long)r.skipped_windows, scale_text, noise_text, alert_text);
}

std::vector<std::pair<std::string, double>> WindowReporter::extras(double val_loss) const {
  return {{"lr", lr_},
          {"tokens_per_s", tokens_per_s_},
          {"mfu", mfu(tokens_per_s_)},
          {"peak_bytes", static_cast<double>(memory_stats(device_).peak_bytes)},
          {"val_loss", val_loss},
          {"loss_z", loss_z_},
          {"grad_norm_z", norm_z_}};
}

}  // namespace accrue::examples
