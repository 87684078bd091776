// DeviceScope: selects a CUDA device for a scope and restores the previous
// one. Host code only, so both CUDA sources (via core/cuda_types.cuh) and
// plain C++ sources that call CUDA libraries (cuDNN) use this one copy.
#pragma once

#include <cuda_runtime.h>

#include "accrue/core/status_check.h"

namespace accrue::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    ACCRUE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) ACCRUE_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

}  // namespace accrue::cuda
