#include "examples/common/loss_scaling.h"

#include <cstdio>

namespace accrue::examples {

// f16: the Window seeds each micro-batch's summed loss with the scale (Note
// [Normalization]), so every activation gradient is B * T times what a mean
// loss gives at the same scale. GradScaler's 65536 for a mean loss is
// therefore 65536 / (B * T) here (a power of two, at least 1).
double initial_loss_scale(const LossScaling& s) {
  double init_scale = 65536.0;
  while (init_scale > 1.0 && init_scale * static_cast<double>(s.micro_batch_tokens) > 65536.0)
    init_scale /= 2;
  return s.init_scale.value_or(init_scale);
}

optim::LossScalerOptions loss_scaler_options(const LossScaling& s) {
  if (s.compute != DType::f16) return optim::LossScalerOptions::none();
  return optim::LossScalerOptions::dynamic()
      .init_scale(initial_loss_scale(s))
      .calibrate(s.calibrate);
}

std::string loss_scaler_text(const LossScaling& s) {
  if (s.compute != DType::f16) return "none";
  if (s.calibrate) return "dynamic, calibrated";
  char text[64];
  std::snprintf(text, sizeof text, "dynamic from %.17g", initial_loss_scale(s));
  return text;
}

}  // namespace accrue::examples
