// The CUDA window close's one-thread launches on the state
// (kernels/cuda/window_close.cuh): the scalar step and the loss-scale
// calibration.
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/cuda/window_close.cuh"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels::cuda {
namespace {

// ---- (b) the scalar step --------------------------------------------------------------------

// One thread: see Note [Window scalar step].
__global__ void window_scalar_step_kernel(const double* partials, int64_t rows, double* state,
                                          CloseConfig config) {
  window_scalar_update(partials, rows, state, config);
}

// One thread: see Note [Scale calibration].
__global__ void calibrate_scale_kernel(const double* amax, double* state, ScalerConfig scaler,
                                       double scale_used, double margin) {
  calibrate_scale_update(*amax, state, scaler, scale_used, margin);
}

}  // namespace

void window_scalar_step(const Tensor& partials, const Tensor& state, const CloseConfig& config) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  window_scalar_step_kernel<<<1, 1, 0, dev::stream_for(device)>>>(
      partials.data<double>(), partials.size(0), state.data<double>(), config);
  ACCRUE_LAUNCH_CHECK();
}

void calibrate_loss_scale(const Tensor& amax, const Tensor& state, const ScalerConfig& scaler,
                          double scale_used, double margin) {
  const int device = state.device().index;
  dev::DeviceScope scope(device);
  calibrate_scale_kernel<<<1, 1, 0, dev::stream_for(device)>>>(
      amax.data<double>(), state.data<double>(), scaler, scale_used, margin);
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
