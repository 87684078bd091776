// The trainers' f16 loss scaling: the dynamic scaler's options and how the
// run record writes them (Note [Run record]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accrue.h"

namespace accrue::examples {

struct LossScaling {
  DType compute = DType::f32;      // only f16 scales
  int64_t micro_batch_tokens = 0;  // B * T
  std::optional<double> init_scale;
  bool calibrate = false;  // Note [Scale calibration]
};

// init_scale, or 65536 / (B * T) rounded down to a power of two (at least 1).
double initial_loss_scale(const LossScaling& s);
// none unless the compute dtype is f16; dynamic from initial_loss_scale.
optim::LossScalerOptions loss_scaler_options(const LossScaling& s);
// "none", "dynamic, calibrated" or "dynamic from <scale>".
std::string loss_scaler_text(const LossScaling& s);

}  // namespace accrue::examples
