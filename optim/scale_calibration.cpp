#include "accrue/optim/scale_calibration.h"

#include <algorithm>

#include "accrue/core/error.h"
#include "accrue/core/grad_mode.h"
#include "accrue/kernels/ops.h"

namespace accrue::optim {

ScaleCalibration::ScaleCalibration(Device device)
    : device_(device), maxima_(zeros({256}, DType::f64, device)) {}

void ScaleCalibration::observe(const Tensor& grad) {
  if (grad.dtype() != DType::f16 || grad.numel() == 0) return;
  ACCRUE_CHECK(grad.device() == device_, "ScaleCalibration: a gradient on ", grad.device().str(),
               " for a calibration on ", device_.str());
  NoGradGuard no_grad;
  if (2 * (count_ + 1) > maxima_.numel()) {  // grow: the old values move over on the device
    Tensor bigger = zeros({2 * maxima_.numel()}, DType::f64, device_);
    bigger.narrow(0, 0, maxima_.numel()).copy_(maxima_);
    maxima_ = bigger;
  }
  const Tensor top = kernels::max(grad),
               bottom = kernels::max(kernels::unary(kernels::UnaryOp::Neg, grad));
  maxima_.narrow(0, 2 * count_, 1).copy_(top.to(DType::f64).reshape({1}));
  maxima_.narrow(0, 2 * count_ + 1, 1).copy_(bottom.to(DType::f64).reshape({1}));
  ++count_;
}

Tensor ScaleCalibration::amax() const {
  NoGradGuard no_grad;
  if (count_ == 0) return zeros({1}, DType::f64, device_);
  return kernels::max(maxima_.narrow(0, 0, 2 * count_)).to(DType::f64).reshape({1});
}

}  // namespace accrue::optim
