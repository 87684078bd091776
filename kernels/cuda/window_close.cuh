// Helpers shared by the CUDA window close (kernels/window_close.h; Note
// [Window close] in optim/window.h), whose launches are
//   grad_norm_partials_kernel  one read of the gradient arena at memory speed
//                              (kernels/cuda/window_close_norm.cu);
//   window_scalar_step_kernel  one thread over the partials and the state
//                              (kernels/cuda/window_close_scalar.cu);
//   fused_optimizer_kernel     one read-modify-write pass over p, g, m, v
//                              (kernels/cuda/window_close_step.cu);
// and, for the layer monitor, the per-slot sums of that pass's chunk rows
// (kernels/cuda/window_close_slot_sums.cu).
// Nothing here reads anything back to the host: the three launches can be
// captured in a CUDA graph, and the host reads the state when it wants.
#pragma once

#include "accrue/core/cuda_types.cuh"

namespace accrue::kernels::cuda {
namespace {

namespace dev = ::accrue::cuda;

constexpr unsigned kFullMask = 0xffffffffu;

using dev::sm_count;

}  // namespace
}  // namespace accrue::kernels::cuda
