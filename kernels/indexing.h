// Shape and index ops without autograd: joining and splitting along a dim,
// repeat_interleave, the gathers and scatter-adds of data-dependent indices,
// one_hot, cumsum, sort and topk. PyTorch's semantics; errors name the op and
// the values. The differentiable versions are autograd/indexing_ops.h.
//
// Note [Indexing ops]
// ~~~~~~~~~~~~~~~~~~~
// - dtypes are never promoted: the operands of cat/stack, and x and src of
//   scatter_add/index_add, share one dtype, and a mismatch says which operand
//   to convert. Index tensors are i64.
// - cat/stack are strided copies into slices of the output (one per input);
//   split/chunk return views (narrow), never copies; repeat_interleave is one
//   copy of a stride-0 expansion.
// - gather/index_select are one gather kernel (index_select's index is a
//   stride-0 expansion, never materialized); scatter_add/index_add are one
//   scatter-add kernel, out-of-place: out = x + the scattered sum. Its sums
//   are deterministic on both backends (Note [Determinism]): each output
//   element sums its sources in position order (CUDA: a stable radix sort of
//   the destinations, or of the indices alone when whole rows are added as
//   in index_add, then one thread per destination, in f32 for 16-bit
//   data, f64 for f64, int64 for integers), added to x and rounded once.
// - every index is checked against its range by kernels/index_checks.h:
//   eagerly, or deferred to a live Window (Note [Deferred index checks]).
//   Meanwhile a bad index never reads or writes outside a tensor: a gathered
//   element reads as all-ones bytes (NaN for floats, -1 for integers), a
//   scattered one is dropped, a one_hot row is all zero.
// - sort and topk order NaN above every number (PyTorch's order) and are
//   stable: equal keys keep their input order, on both backends, so the CPU
//   and CUDA results are identical (Note [CUDA row sorts]).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "accrue/core/tensor.h"

namespace accrue {

// split's second argument: a size every piece has (the last may be smaller),
// or the sizes of the pieces, which must add up to the dim's size. A braced
// list is always the sizes: split(x, {4}, 0) is one piece of 4.
struct SplitSizes {
  SplitSizes(int64_t size) : each(size), by_size(true) {}  // NOLINT: implicit by design
  SplitSizes(std::initializer_list<int64_t> sizes) : sizes(sizes) {}
  SplitSizes(std::vector<int64_t> sizes) : sizes(std::move(sizes)) {}  // NOLINT
  int64_t each = 0;
  std::vector<int64_t> sizes;
  bool by_size = false;
};

// What sort and topk return.
struct SortResult {
  Tensor values;   // x's dtype
  Tensor indices;  // i64, positions along dim
};

}  // namespace accrue

namespace accrue::kernels {

// Note [CUDA row sorts]
// ~~~~~~~~~~~~~~~~~~~~~
// CUDA sort, argsort and topk sort a row of up to kMaxCudaSortRow elements in
// one block's shared memory, by a bitonic network over the row padded to a
// power of two (48 KiB for 4096 f64 keys and i32 positions), one launch for
// all rows. Longer rows (a vocabulary's logits) go to CUB's segmented stable
// radix sort over order-preserving unsigned keys (NaN highest, -0 equal to
// +0, descending as the bitwise complement): three launches, 16 to 24 bytes
// of scratch per element, at most 2^31 - 1 elements per call (larger calls
// are refused naming the sizes). topk sorts whole rows either way. Both
// paths, like the CPU's, break ties by position, so all three give the same
// values and indices.
inline constexpr int64_t kMaxCudaSortRow = 4096;

// ---- joining and splitting ------------------------------------------------------
// The inputs joined along dim (every other size equal, one dtype and device).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// The inputs (one shape) joined along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);

// The lengths of split's pieces along dim; throws naming the op and values.
std::vector<int64_t> split_lengths(const Tensor& x, const SplitSizes& sizes, int64_t dim,
                                   const char* op = "split");
// chunk's: ceil(size / chunks) each, the last smaller, fewer pieces when the
// size does not fill them (PyTorch's rule).
std::vector<int64_t> chunk_lengths(const Tensor& x, int64_t chunks, int64_t dim);
// Views of x (narrow), never copies.
std::vector<Tensor> split(const Tensor& x, const SplitSizes& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// Each slice of x along dim repeated `repeats` times in place:
// [a, b] -> [a, a, b, b] (repeats 2). A 0-d x is taken as [1].
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim);
// Its gradient: grad's groups of `repeats` consecutive slices along dim
// summed, back to the input's shape.
Tensor repeat_interleave_backward(const Tensor& grad, int64_t repeats, int64_t dim,
                                  const Shape& input_shape);

// ---- gathers and scatter-adds (Note [Indexing ops]) ----------------------------------
// out[i][j][k] = x[i][index[i][j][k]][k] (dim 1); index (i64) has x's rank,
// no larger than x in any other dim; out has index's shape and x's dtype (any dtype).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// x plus src scattered: out = x; out[i][index[i][j][k]][k] += src[i][j][k]
// (dim 1). index has x's rank, no larger than src in any dim nor than x in
// any dim but dim; src's elements beyond index's shape are unused. Float
// dtypes, or i32/i64 (counts; alpha then a whole number, sums wrap as
// integer adds do).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// x's slices along dim at the positions of index (1-D i64, or 0-d).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out = x; out.select(dim, index[i]) += alpha * src.select(dim, i); index 1-D
// i64 of src.size(dim) elements; src is x's shape elsewhere. Dtypes as
// scatter_add's: index_add(zeros({E}, i64), 0, expert, ones({T}, i64)) counts.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha = 1.0);
// index (i64, any shape) -> [..., num_classes] of dtype: 1 at the index, 0
// elsewhere. num_classes -1 takes max(index) + 1 (a host read-back).
Tensor one_hot(const Tensor& index, int64_t num_classes = -1, DType dtype = DType::i64);

// ---- scans and orderings ----------------------------------------------------------
// Running sums along dim (from the end when reverse: the gradient of the
// forward sum). Float inputs keep their dtype (sums in f32, f64 for f64);
// integer and bool inputs give i64.
Tensor cumsum(const Tensor& x, int64_t dim, bool reverse = false);

// Stable, NaN last (first when descending). Any dtype but bool.
SortResult sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
// The k largest (smallest when !largest) along dim, in sorted order (also
// when !sorted: any order is allowed there), ties by position.
SortResult topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                bool sorted = true);

}  // namespace accrue::kernels
