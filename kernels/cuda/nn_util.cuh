// Host helpers shared by the CUDA neural-network kernels' launchers:
// kernels/cuda/embedding.cu, cross_entropy.cu and layer_norm.cu. Device
// helpers live in kernels/cuda/block_reduce.cuh.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "accrue/core/cuda_types.cuh"
#include "accrue/kernels/backend.h"

namespace accrue::kernels::cuda {
namespace {

namespace cu = ::accrue::cuda;

// Threads per block of the kernels with a 1-D grid over elements or columns.
constexpr int kThreads = 256;

// Threads for a kernel with one block per row of `cols` elements: about eight
// elements per thread, between one warp and 512 threads.
inline int row_threads(int64_t cols) {
  int threads = 32;
  while (threads < 512 && threads * int64_t{8} < cols)
    threads *= 2;
  return threads;
}

inline void check_grid_x(int64_t blocks, const char* op) {
  ACCRUE_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": ", blocks,
               " rows exceed the CUDA grid limit");
}

// Calls f(Out{}) for a gradient output that is f32 or the input's dtype
// (Note [Fused weight-gradient accumulation]: fp32 arena slots).
template <class In, class F>
void visit_grad_dtype(DType out, const char* op, F&& f) {
  cu::visit_float_dtype(out, op, [&](auto tag) {
    using Out = decltype(tag);
    if constexpr (std::is_same_v<Out, In> || std::is_same_v<Out, float>) {
      f(Out{});
    } else {
      ACCRUE_FAIL(op, ": a gradient of dtype ", dtype_name(out), " must be f32 or the input's ",
                  "dtype");
    }
  });
}

// The floating dtype sums are kept in: f64 for f64, f32 otherwise.
inline DType accumulate_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// t itself when it is already contiguous and of dtype d (or undefined), else a
// converted contiguous copy (a small device copy: no host synchronization).
inline Tensor as_dtype(const Tensor& t, DType d) {
  if (!t.defined()) return t;
  return t.dtype() == d ? t.contiguous() : t.to(d).contiguous();
}

}  // namespace
}  // namespace accrue::kernels::cuda
