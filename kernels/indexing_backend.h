// The backend side of the indexing ops (kernels/indexing.h): the geometry of
// an indexed dim and the functions kernels/cpu/indexing.cpp and
// kernels/cuda/indexing.cu implement (kernels/indexing_functions.inc).
// Private to kernels/.
#pragma once

#include <cstdint>

#include "accrue/core/strided_index.h"
#include "accrue/core/tensor.h"
#include "accrue/kernels/backend_fn.h"

namespace accrue::kernels {

// Where element j (row-major over the index's shape) of a gather or scatter
// lands in the indexed tensor t: at offset lines.offset_of(j) + index[j] *
// stride from t's element 0. lines has the index's shape and t's strides with
// 0 at the indexed dim; size is t's size along it, the range of a valid index.
// An index outside [0, size) (possible only while a check is deferred: Note
// [Deferred index checks]) is read as all-ones bytes, and dropped in a scatter.
struct IndexedDim {
  StridedGeometry lines;
  int64_t stride = 0;
  int64_t size = 0;
  int32_t dim = 0;  // the indexed dim (0 for a 0-d t)
};

}  // namespace accrue::kernels

namespace accrue::kernels::cpu {
#include "accrue/kernels/indexing_functions.inc"
}  // namespace accrue::kernels::cpu

namespace accrue::kernels::cuda {
#include "accrue/kernels/indexing_functions.inc"
}  // namespace accrue::kernels::cuda
