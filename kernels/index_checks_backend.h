// The backend side of the deferred index checks (kernels/index_checks.h): the
// functions kernels/cpu/index_checks.cpp and kernels/cuda/index_checks.cu
// implement. Private to kernels/.
#pragma once

#include <cstdint>

#include "core/tensor.h"

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

// Note [Deferred index checks]: when an element of indices (contiguous, i32 or
// i64) lies outside the range, writes NaN into items (one f64 element) and,
// when record (i64 [kIndexFaultFields]) holds no fault yet, keeps this call's
// first one there. Never synchronizes the host.
namespace cpu {
void record_index_fault(const Tensor& indices, const IndexCheckCall& call, const Tensor& record,
                        const Tensor& items);
}  // namespace cpu

namespace cuda {
void record_index_fault(const Tensor& indices, const IndexCheckCall& call, const Tensor& record,
                        const Tensor& items);
}  // namespace cuda

}  // namespace accrue::kernels
