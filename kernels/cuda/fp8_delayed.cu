// The device side of FP8 delayed scaling (Note [FP8 delayed scaling] in
// kernels/fp8.h): merging a cast's amax into a window's, and the scale update
// at the close. Both are tiny; what they save is the amax pass over x.
#include <cstdint>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/fp8_backend.h"

namespace accrue::kernels::cuda {

namespace cu = ::accrue::cuda;

namespace {

// The CPU's quiet NaN, so both devices leave the same bits.
__device__ __forceinline__ float quiet_nan() {
  return __uint_as_float(0x7fc00000u);
}

// An atomic max of the bits (amaxes are >= 0 or NaN, so their bits order as
// the values, NaN's above inf's): micro-steps in flight on several streams
// merge into one running amax, in any order, to the same value (Note
// [Concurrent micro-batches]). A NaN is merged as the quiet NaN.
__global__ void amax_merge_kernel(float* running, const float* amax) {
  // The max of non-negative floats is the max of their bits as unsigned
  // integers, NaN's bits above infinity's. An amax is a magnitude: a sign
  // bit (-0.0 from a caller) would rank above every value, NaN included.
  const float a = fabsf(*amax);
  const uint32_t bits = isnan(a) ? __float_as_uint(quiet_nan()) : __float_as_uint(a);
  if (bits != 0u) atomicMax(reinterpret_cast<uint32_t*>(running), bits);
}

__global__ void delayed_update_kernel(float* state, int64_t rows, int64_t width, float fp8_max,
                                      int margin) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows) return;
  float* row = state + i * width;
  const float window = row[2];
  row[2] = 0.0f;
  if (!isfinite(window)) return;  // a skipped window: the scale stays
  float* history = row + 3;
  const int64_t h = width - 3;
  for (int64_t j = h - 1; j > 0; --j)
    history[j] = history[j - 1];
  history[0] = window;
  float m = 0.0f;
  for (int64_t j = 0; j < h; ++j)
    m = fmaxf(m, history[j]);
  row[0] = fp8_scale_rule(m, fp8_max, margin, /*power_of_two=*/false);
  row[1] = fp8_inverse_scale(m, row[0], /*guard=*/false);
}

}  // namespace

void fp8_amax_merge(const Tensor& running, const Tensor& amax) {
  const int dev = running.device().index;
  cu::DeviceScope scope(dev);
  amax_merge_kernel<<<1, 1, 0, cu::stream_for(dev)>>>(static_cast<float*>(running.data_ptr()),
                                                      static_cast<const float*>(amax.data_ptr()));
  ACCRUE_LAUNCH_CHECK();
}

void fp8_delayed_scale_update(const Tensor& state, float fp8_max, int margin) {
  const int dev = state.device().index;
  cu::DeviceScope scope(dev);
  const int64_t rows = state.size(0);
  constexpr int kThreads = 128;
  delayed_update_kernel<<<cu::grid_for(rows, kThreads), kThreads, 0, cu::stream_for(dev)>>>(
      static_cast<float*>(state.data_ptr()), rows, state.size(1), fp8_max, margin);
  ACCRUE_LAUNCH_CHECK();
}

}  // namespace accrue::kernels::cuda
