// Note [Scale calibration]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The dynamic loss scale's opt-in start (optim::LossScalerOptions::calibrate):
// instead of guessing a scale and backing off through skipped windows, the
// first window runs at scale_used (1), the engine's gradient observer records
// the largest |value| of every f16 gradient that flows between ops in its
// backwards (ScaleCalibration, below), and after that window's close
//   scale = 2^floor(log2(65504 / (amax / scale_used * margin)))
// clamped to [min_scale, max_scale], with the growth tracker reset: the
// largest power of two that keeps the largest gradient seen `margin` times
// below f16's largest finite value. Gradients are linear in the seed, so
// the first window's amax at scale_used predicts every later one at the same
// weights. A skipped first window (state[kFoundInf]), an amax that is not a
// positive finite number (no f16 gradient seen) leave the state as the scalar
// step left it. Runs on the device after the optimizer step
// (kernels::calibrate_loss_scale, kernels/window_close.h): nothing reads back
// to the host.
//
// ScaleCalibration is the observer: during the first window's backwards it
// records the largest |value| of every f16 gradient passed between ops (Note
// [Gradient observer]), two device scalars per gradient (max(g) and max(-g)),
// never reading them back to the host.
#pragma once

#include <cstdint>

#include "accrue/autograd/gradient_observer.h"
#include "accrue/core/tensor.h"

namespace accrue::optim {

class ScaleCalibration : public autograd::GradientObserver {
 public:
  explicit ScaleCalibration(Device device);
  // f16 gradients only: bf16 and f32 have f32's range and need no scale.
  void observe(const Tensor& grad) override;
  // f64 [1] on the device: the largest |value| observed, 0 when nothing was.
  Tensor amax() const;

 private:
  Device device_;
  Tensor maxima_;  // f64 [capacity]: max(g) and max(-g) of each observed gradient
  int64_t count_ = 0;
};

}  // namespace accrue::optim
