// Loss scaling options: none, static or dynamic (as torch.amp.GradScaler).
//
// The scaler's state — the scale and its growth tracker — lives on the device
// inside the Window's state tensor and is updated by the window close, so no
// window ever synchronizes the host for it.
//
// Note [Loss scale departures]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the dynamic scaler differs from GradScaler on purpose (README,
// "Differences from PyTorch"):
//  - the cap: the scale never grows past max_scale, 2^24 by default
//    (ScalerConfig::max_scale, applied by the close: Note [Window scalar
//    step]); GradScaler has none. max_scale(INFINITY) removes it;
//  - the meaning: each item's loss is seeded with S and 1/N comes at the close
//    (Note [Normalization]), where GradScaler's recipe seeds each item with
//    S / N. The same S therefore gives backward values N times larger here,
//    and GradScaler's 65536 start overflows f16 on models whose per-item
//    gradients are large (GPT-2 124M skipped 6 of its first 20 windows,
//    bench/RESULTS.md). calibrate() picks the start from the first window's
//    gradients instead (Note [Scale calibration]); dynamic() keeps 65536,
//    which suits small models (the MLP demo skips none).
#pragma once

#include "accrue/kernels/window_close.h"

namespace accrue::optim {

// The policy; the kernels see only ScalerConfig's plain flags.
enum class ScalerMode { None, Static, Dynamic };

class LossScalerOptions {
 public:
  // No scaling: backward seeds are 1.
  static LossScalerOptions none();
  // A fixed scale.
  static LossScalerOptions fixed(double scale);
  // Dynamic: starts at 65536, x2 after 2000 clean windows, x0.5 on overflow.
  static LossScalerOptions dynamic();

  LossScalerOptions& init_scale(double v);
  LossScalerOptions& growth_factor(double v);
  LossScalerOptions& backoff_factor(double v);
  LossScalerOptions& growth_interval(int64_t v);
  LossScalerOptions& min_scale(double v);
  LossScalerOptions& max_scale(double v);
  // Dynamic only, opt-in (Note [Scale calibration] in optim/scale_calibration.h):
  // the first window runs at scale 1 and records the largest f16 gradient
  // its backwards pass between ops; its close sets the scale to the largest
  // power of two that keeps that gradient `margin` times below f16's largest
  // value. init_scale is then not used.
  LossScalerOptions& calibrate(bool on = true, double margin = 8.0);

  ScalerMode mode() const { return mode_; }
  double init_scale() const { return init_scale_; }
  bool calibrates() const { return calibrate_; }
  double calibration_margin() const { return calibration_margin_; }
  const kernels::ScalerConfig& config() const { return config_; }
  // Throws accrue::Error naming the first invalid value.
  void validate() const;

 private:
  ScalerMode mode_ = ScalerMode::None;
  kernels::ScalerConfig config_;  // scaled and dynamic follow mode_
  double init_scale_ = 1.0;
  bool calibrate_ = false;
  double calibration_margin_ = 8.0;
};

}  // namespace accrue::optim
