// Small helpers shared by the CPU reference kernels (kernels/cpu/*.cpp): strided
// element addressing and the widen/compute/round-back rule for floating types.
// Private to kernels/cpu/.
#pragma once

#include <algorithm>
#include <type_traits>

#include "accrue/core/error.h"
#include "accrue/core/parallel.h"
#include "accrue/core/strided_index.h"
#include "accrue/core/tensor.h"

namespace accrue::kernels::cpu {

// Element offset of the i-th element (row-major order) of a tensor with any
// strides. Contiguous tensors skip the index arithmetic: the branch is the same
// on every iteration, so it costs nothing next to offset_of's divisions.
class Indexer {
 public:
  explicit Indexer(const Tensor& t) : contiguous_(t.is_contiguous()) {
    ACCRUE_CHECK(t.dim() <= kMaxDims, "cpu kernel: rank ", t.dim(), " exceeds ", kMaxDims);
    geometry_.rank = static_cast<int32_t>(t.dim());
    for (int d = 0; d < geometry_.rank; ++d) {
      geometry_.sizes[d] = t.shape()[d];
      geometry_.strides[d] = t.strides()[d];
    }
  }
  int64_t operator()(int64_t i) const { return contiguous_ ? i : geometry_.offset_of(i); }

 private:
  bool contiguous_;
  StridedGeometry geometry_;
};

// The type elementwise math runs in: double for f64, float for everything else
// (bf16/f16 widen to float and round back once, exactly like the CUDA kernels).
template <class T>
using math_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
inline math_t<T> load(T v) {
  return static_cast<math_t<T>>(v);
}
template <class T>
inline T store(math_t<T> v) {
  return T(v);
}
// Accumulations of the reference run in double whatever the storage type.
template <class T>
inline double load_double(T v) {
  return static_cast<double>(static_cast<math_t<T>>(v));
}
template <class T>
inline T store_double(double v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return T(static_cast<float>(v));
  }
}

template <class T>
inline T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Calls f(T{}) for the floating dtypes only; anything else is a dispatch bug.
template <class F>
decltype(auto) visit_float(DType t, const char* op, F&& f) {
  switch (t) {  // See Note [DType list].
    ACCRUE_FOR_EACH_FLOAT_DTYPE(ACCRUE_HOST_DTYPE_CASE)
    default:
      break;
  }
  ACCRUE_FAIL(op, ": dtype ", dtype_name(t), " is not a floating dtype");
}

// Work per parallel_for chunk (Note [CPU threads]): about this many element
// operations (or multiply-adds) per chunk, so that waking a worker (a few
// microseconds) stays small next to the work it gets, and tensors smaller than
// this run inline on the caller.
constexpr int64_t kParallelWork = int64_t{1} << 15;

// The grain of a parallel_for whose items (rows, say) cost `work_per_item`
// element operations each.
inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kParallelWork / std::max<int64_t>(work_per_item, 1));
}

}  // namespace accrue::kernels::cpu
