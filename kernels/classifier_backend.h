// The backend side of the fused classifier (kernels/classifier.h): what
// kernels/cpu/classifier.cpp and kernels/cuda/classifier.cu implement, listed
// in kernels/classifier_functions.inc. Private to kernels/.
// kernels/classifier.cpp has validated everything and allocated every output;
// rows > 0 and numel > 0 wherever a function is called.
#pragma once

#include <cstdint>

#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels::cpu {
#include "accrue/kernels/classifier_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/classifier_functions.inc"
}  // namespace accrue::kernels::cuda
