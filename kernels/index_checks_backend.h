// The backend side of the deferred index checks (kernels/index_checks.h): the
// function kernels/cpu/index_checks.cpp and kernels/cuda/index_checks.cu
// implement (kernels/index_checks_functions.inc). Private to kernels/.
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// One deferred check: the valid range and where the call ran.
struct IndexCheckCall {
  int64_t bound = 0;
  int64_t ignore_index = 0;
  bool use_ignore = false;
  int64_t id = 0;
  int64_t window = 0;
  int64_t micro_step = 0;
};

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/index_checks_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/index_checks_functions.inc"
}  // namespace accrue::kernels::cuda
