// The observer of Note [Scale calibration] (kernels/window_close.h): during
// the first window's backwards it records the largest |value| of every f16
// gradient passed between ops (Note [Gradient observer]), two device scalars
// per gradient (max(g) and max(-g)), never reading them back to the host.
#pragma once

#include <cstdint>

#include "autograd/gradient_observer.h"
#include "core/tensor.h"

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
