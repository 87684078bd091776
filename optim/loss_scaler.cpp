#include "accrue/optim/loss_scaler.h"

#include <cmath>

#include "accrue/core/error.h"

namespace accrue::optim {

LossScalerOptions LossScalerOptions::none() {
  return LossScalerOptions();
}

LossScalerOptions LossScalerOptions::fixed(double scale) {
  LossScalerOptions o;
  o.mode_ = ScalerMode::Static;
  o.config_.scaled = true;
  o.init_scale_ = scale;
  o.validate();
  return o;
}

LossScalerOptions LossScalerOptions::dynamic() {
  LossScalerOptions o;
  o.mode_ = ScalerMode::Dynamic;
  o.config_.scaled = true;
  o.config_.dynamic = true;
  o.init_scale_ = 65536.0;
  return o;
}

LossScalerOptions& LossScalerOptions::init_scale(double v) {
  init_scale_ = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::growth_factor(double v) {
  config_.growth_factor = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::backoff_factor(double v) {
  config_.backoff_factor = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::growth_interval(int64_t v) {
  config_.growth_interval = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::min_scale(double v) {
  config_.min_scale = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::max_scale(double v) {
  config_.max_scale = v;
  return *this;
}
LossScalerOptions& LossScalerOptions::calibrate(bool on, double margin) {
  calibrate_ = on;
  calibration_margin_ = margin;
  return *this;
}

void LossScalerOptions::validate() const {
  ACCRUE_CHECK(std::isfinite(init_scale_) && init_scale_ > 0,
               "LossScaler: init_scale = ", init_scale_, " must be a finite number > 0");
  kernels::check_scaler_config(config_, "LossScaler");  // Note [Option checks]
  ACCRUE_CHECK(!calibrate_ || mode_ == ScalerMode::Dynamic,
               "LossScaler: calibrate() needs the dynamic scaler (LossScalerOptions::dynamic()); "
               "this scaler is ",
               mode_ == ScalerMode::Static ? "static" : "none");
  ACCRUE_CHECK(std::isfinite(calibration_margin_) && calibration_margin_ >= 1.0,
               "LossScaler: calibration margin = ", calibration_margin_,
               " must be a finite number >= 1");
  if (mode_ != ScalerMode::Dynamic) return;
  ACCRUE_CHECK(init_scale_ >= config_.min_scale && init_scale_ <= config_.max_scale,
               "LossScaler: init_scale = ", init_scale_, " lies outside [min_scale, max_scale] = [",
               config_.min_scale, ", ", config_.max_scale, "]");
}

}  // namespace accrue::optim
