// The CUDA window close of a build without CUDA: the functions exist, so the
// dispatch links, and throw. No CUDA tensor can exist in such a build (see
// kernels/cuda/unavailable.cpp), so reaching one means a bug, reported.
#include "kernels/window_close_backend.h"

namespace accrue::kernels::cuda {

int64_t norm_partials_rows(int64_t, DType, int) {
  ACCRUE_FAIL("norm_partials_rows: accrue was built without CUDA");
}
int64_t norm_row_elements(int64_t, DType, int) {
  ACCRUE_FAIL("norm_row_elements: accrue was built without CUDA");
}
void grad_norm_partials(const Tensor&, const Tensor&, int64_t, int64_t) {
  ACCRUE_FAIL("grad_norm_partials: accrue was built without CUDA");
}
void window_scalar_step(const Tensor&, const Tensor&, const CloseConfig&) {
  ACCRUE_FAIL("window_scalar_step: accrue was built without CUDA");
}
void fused_optimizer_step(const OptimizerConfig&, const OptimizerBuffers&, const Tensor&) {
  ACCRUE_FAIL("fused_optimizer_step: accrue was built without CUDA");
}
void store_hyperparameters(const HyperValues&, const Tensor&) {
  ACCRUE_FAIL("store_hyperparameters: accrue was built without CUDA");
}

void store_slot_flags(const std::vector<bool>&, const Tensor&) {
  ACCRUE_FAIL("store_slot_flags: accrue was built without CUDA");
}
void advance_slot_steps(double, double, const Tensor&, const Tensor&, const Tensor&) {
  ACCRUE_FAIL("advance_slot_steps: accrue was built without CUDA");
}
void calibrate_loss_scale(const Tensor&, const Tensor&, const ScalerConfig&, double, double) {
  ACCRUE_FAIL("calibrate_loss_scale: accrue was built without CUDA");
}
void step_sums_per_slot(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) {
  ACCRUE_FAIL("step_sums_per_slot: accrue was built without CUDA");
}

}  // namespace accrue::kernels::cuda
